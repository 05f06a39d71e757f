//! What a run's Job and pod say: a pure mapping from observed Kubernetes state to the run's
//! phase (pending, running, or finished with a `Succeeded` reason and message).
//!
//! The runner's exit codes ([`toolyard_api::protocol::runner_exit`]) and its one-line
//! termination message decide between `Failed` and `TimedOut`; the Job's `DeadlineExceeded`
//! means `TimedOut`; pods that cannot start (no node, image not pullable, container not
//! configurable) end the run after a bounded grace instead of waiting for the deadline.

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ContainerStateTerminated, ContainerStatus, Pod};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use toolyard_api::conditions::reason;
use toolyard_api::protocol::runner_exit;

use crate::pod::INSTALL_CONTAINER;

/// How long a pod may stay unable to start before its run fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Graces {
    /// `ErrImagePull` / `ImagePullBackOff` / `CreateContainerConfigError`, counted from pod creation.
    pub image_pull: Duration,
    /// `PodScheduled=False/Unschedulable`, counted from the condition's transition.
    pub unschedulable: Duration,
}

/// The phase of a run as its Job and pod show it.
#[derive(Clone, Debug, PartialEq)]
pub enum Observed {
    /// Not running yet. Look again after `recheck_after` when a grace is counting down.
    Pending {
        /// Why it is not running yet.
        message: String,
        /// When a grace ends that may turn this into a failure.
        recheck_after: Option<Duration>,
    },
    /// The main container runs.
    Running {
        /// When it started.
        started: Timestamp,
    },
    /// Done, one way or another.
    Finished(Finish),
}

/// A finished run.
#[derive(Clone, Debug, PartialEq)]
pub struct Finish {
    /// A `Succeeded` reason: `Succeeded`, `Failed`, `TimedOut`, `Unschedulable`, `ImagePullFailed`.
    pub reason: &'static str,
    /// What happened, for the user.
    pub message: String,
    /// When the main container started, if it did.
    pub started: Option<Timestamp>,
    /// When it ended.
    pub finished: Timestamp,
    /// The Job is still active and must be deleted (the pod can never start).
    pub stop_job: bool,
}

impl Finish {
    /// True for the one successful reason.
    pub fn succeeded(&self) -> bool {
        self.reason == reason::SUCCEEDED
    }
}

/// Message of a run whose pod has not started (stable, so status is not rewritten per pod event).
pub const WAITING: &str = "waiting for the pod to start";

/// Longest piece of a termination message kept in a condition message.
const MAX_TERMINATION_MESSAGE: usize = 1024;

/// Maps a Job and its newest pod to the run's phase.
///
/// `container` is the main container's name; `noun` names what runs in it ("tool", "agent").
pub fn observe(job: &Job, pod: Option<&Pod>, container: &str, noun: &str, now: Timestamp, graces: &Graces) -> Observed {
    let main = pod.and_then(|p| container_status(p, container, false));
    let started = main.and_then(started_at);
    let job_conditions = job.status.as_ref().and_then(|s| s.conditions.as_deref()).unwrap_or_default();
    let holds =
        |types: &[&str]| job_conditions.iter().find(|c| types.contains(&c.type_.as_str()) && c.status == "True");

    if let Some(done) = holds(&["Complete", "SuccessCriteriaMet"]) {
        let finished = main
            .and_then(terminated)
            .and_then(|t| t.finished_at.as_ref())
            .or(job.status.as_ref().and_then(|s| s.completion_time.as_ref()))
            .or(done.last_transition_time.as_ref())
            .map(|t| t.0)
            .unwrap_or(now);
        return Observed::Finished(Finish {
            reason: reason::SUCCEEDED,
            message: format!("the {noun} finished successfully"),
            started,
            finished,
            stop_job: false,
        });
    }

    if let Some(failed) = holds(&["Failed", "FailureTarget"]) {
        let finished_at_condition = failed.last_transition_time.as_ref().map(|t| t.0).unwrap_or(now);
        if failed.reason.as_deref() == Some("DeadlineExceeded") {
            let limit = job.spec.as_ref().and_then(|s| s.active_deadline_seconds).unwrap_or_default();
            return Observed::Finished(Finish {
                reason: reason::TIMED_OUT,
                message: format!("the {noun} did not finish before its deadline ({limit}s left when its Job started)"),
                started,
                finished: finished_at_condition,
                stop_job: false,
            });
        }
        if let Some(t) = main.and_then(terminated) {
            let (reason, message) = exit_outcome(t, noun);
            return Observed::Finished(Finish {
                reason,
                message,
                started,
                finished: t.finished_at.as_ref().map(|x| x.0).unwrap_or(finished_at_condition),
                stop_job: false,
            });
        }
        if let Some(t) = pod.and_then(|p| container_status(p, INSTALL_CONTAINER, true)).and_then(terminated)
            && t.exit_code != 0
        {
            return Observed::Finished(Finish {
                reason: reason::FAILED,
                message: format!(
                    "the runner could not be installed (init container exited with code {}){}",
                    t.exit_code,
                    detail(t.message.as_deref().or(t.reason.as_deref()))
                ),
                started: None,
                finished: t.finished_at.as_ref().map(|x| x.0).unwrap_or(finished_at_condition),
                stop_job: false,
            });
        }
        return Observed::Finished(Finish {
            reason: reason::FAILED,
            message: format!(
                "the {noun}'s Job failed ({}){}",
                failed.reason.as_deref().unwrap_or("no reason given"),
                detail(failed.message.as_deref())
            ),
            started,
            finished: finished_at_condition,
            stop_job: false,
        });
    }

    let Some(pod) = pod else {
        return pending(WAITING, None);
    };

    if let Some(blocked) = cannot_start(pod, noun, now, graces) {
        return blocked;
    }

    if let Some(started) = started {
        return Observed::Running { started };
    }
    if pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") {
        return Observed::Running { started: now };
    }
    pending(WAITING, None)
}

fn pending(message: &str, recheck_after: Option<Duration>) -> Observed {
    Observed::Pending { message: message.to_owned(), recheck_after }
}

/// Pods that cannot start: image problems, configuration errors, no node.
fn cannot_start(pod: &Pod, noun: &str, now: Timestamp, graces: &Graces) -> Option<Observed> {
    let status = pod.status.as_ref()?;
    let age = pod.metadata.creation_timestamp.as_ref().map(|t| elapsed(t.0, now)).unwrap_or(Duration::ZERO);
    let all = status.init_container_statuses.iter().flatten().chain(status.container_statuses.iter().flatten());
    for cs in all {
        let Some(waiting) = cs.state.as_ref().and_then(|s| s.waiting.as_ref()) else { continue };
        let why = waiting.reason.as_deref().unwrap_or_default();
        let what =
            if cs.name == INSTALL_CONTAINER { "the runner image".to_owned() } else { format!("the {noun} image") };
        let (reason, message, grace) = match why {
            "InvalidImageName" | "ErrImageNeverPull" => (
                reason::IMAGE_PULL_FAILED,
                format!("{what} {:?} cannot be pulled: {why}{}", cs.image, detail(waiting.message.as_deref())),
                Duration::ZERO,
            ),
            "ErrImagePull" | "ImagePullBackOff" => (
                reason::IMAGE_PULL_FAILED,
                format!("{what} {:?} cannot be pulled: {why}{}", cs.image, detail(waiting.message.as_deref())),
                graces.image_pull,
            ),
            "CreateContainerConfigError" | "CreateContainerError" => (
                reason::FAILED,
                format!("container {} cannot start: {why}{}", cs.name, detail(waiting.message.as_deref())),
                graces.image_pull,
            ),
            _ => continue,
        };
        if age >= grace {
            return Some(Observed::Finished(Finish { reason, message, started: None, finished: now, stop_job: true }));
        }
        return Some(pending(WAITING, Some(grace - age)));
    }

    let unschedulable =
        status.conditions.iter().flatten().find(|c| {
            c.type_ == "PodScheduled" && c.status == "False" && c.reason.as_deref() == Some("Unschedulable")
        })?;
    let since = unschedulable.last_transition_time.as_ref().map(|t| elapsed(t.0, now)).unwrap_or(Duration::ZERO);
    if since >= graces.unschedulable {
        return Some(Observed::Finished(Finish {
            reason: reason::UNSCHEDULABLE,
            message: format!(
                "no node could run the pod for {}s{}",
                graces.unschedulable.as_secs(),
                detail(unschedulable.message.as_deref())
            ),
            started: None,
            finished: now,
            stop_job: true,
        }));
    }
    Some(pending("waiting for a node to run the pod", Some(graces.unschedulable - since)))
}

/// Reason and message for a main container that ended.
fn exit_outcome(t: &ContainerStateTerminated, noun: &str) -> (&'static str, String) {
    let msg = detail(t.message.as_deref());
    match t.exit_code {
        runner_exit::TOOL_FAILED => (reason::FAILED, format!("the {noun} failed (exit code {}){msg}", t.exit_code)),
        runner_exit::TIMED_OUT => {
            (reason::TIMED_OUT, format!("the {noun} was stopped at its deadline (exit code {}){msg}", t.exit_code))
        }
        runner_exit::RUNNER_ERROR => (reason::FAILED, format!("the runner failed (exit code {}){msg}", t.exit_code)),
        code => {
            let why = t.reason.as_deref().filter(|r| !r.is_empty() && *r != "Error");
            let why = why.map(|r| format!(", {r}")).unwrap_or_default();
            (reason::FAILED, format!("the {noun} container exited with code {code}{why}{msg}"))
        }
    }
}

/// `": <first line-ish of s>"`, bounded, or nothing when `s` is empty.
fn detail(s: Option<&str>) -> String {
    let Some(s) = s.map(str::trim).filter(|s| !s.is_empty()) else { return String::new() };
    let mut out = String::with_capacity(s.len().min(MAX_TERMINATION_MESSAGE) + 2);
    out.push_str(": ");
    for c in s.chars() {
        if out.len() + c.len_utf8() > MAX_TERMINATION_MESSAGE {
            out.push('…');
            break;
        }
        out.push(if c.is_control() { ' ' } else { c });
    }
    out
}

fn container_status<'a>(pod: &'a Pod, name: &str, init: bool) -> Option<&'a ContainerStatus> {
    let status = pod.status.as_ref()?;
    let list = if init { status.init_container_statuses.as_ref() } else { status.container_statuses.as_ref() };
    list?.iter().find(|c| c.name == name)
}

fn terminated(cs: &ContainerStatus) -> Option<&ContainerStateTerminated> {
    cs.state.as_ref()?.terminated.as_ref()
}

fn started_at(cs: &ContainerStatus) -> Option<Timestamp> {
    let state = cs.state.as_ref()?;
    if let Some(r) = &state.running {
        return r.started_at.as_ref().map(|t| t.0);
    }
    state.terminated.as_ref()?.started_at.as_ref().map(|t| t.0)
}

/// `now - since`, zero when the clock went backwards.
pub fn elapsed(since: Timestamp, now: Timestamp) -> Duration {
    let d: SignedDuration = now.duration_since(since);
    d.try_into().unwrap_or(Duration::ZERO)
}

/// The newest pod of a Job, by creation time.
pub fn newest<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> Option<&'a Pod> {
    pods.into_iter().max_by(|a, b| a.metadata.creation_timestamp.cmp(&b.metadata.creation_timestamp))
}

#[cfg(test)]
mod tests;
