//! The hardened pod shape shared by call Jobs, task Jobs and warm pools.
//!
//! Every pod: no ServiceAccount token, non-root UID 65532, no privilege escalation, every
//! capability dropped, read-only root filesystem with an emptyDir `/tmp`, seccomp
//! `RuntimeDefault`, no Service environment variables. An init container from the runner
//! image installs `toolyard-runner` into an emptyDir at `/toolyard/bin`, so the tool's own
//! image needs none of our code.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapVolumeSource, Container, EmptyDirVolumeSource, EnvVar, EnvVarSource,
    PersistentVolumeClaimVolumeSource, PodSecurityContext, PodSpec, ResourceRequirements, SeccompProfile,
    SecretKeySelector, SecretVolumeSource, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// Volume holding the runner binary.
pub const BIN_VOLUME: &str = "toolyard-bin";
/// Where the runner binary's volume is mounted.
pub const BIN_DIR: &str = "/toolyard/bin";
/// The runner binary inside run pods.
pub const RUNNER: &str = "/toolyard/bin/toolyard-runner";
/// The runner binary inside the runner image.
pub const RUNNER_IN_IMAGE: &str = "/toolyard-runner";
/// Command of the init container: copies the runner into the shared volume (the runner image
/// provides `cp`; no shell is needed).
pub const INSTALL_COMMAND: [&str; 3] = ["cp", RUNNER_IN_IMAGE, RUNNER];
/// Name of the init container.
pub const INSTALL_CONTAINER: &str = "install-runner";
/// Writable scratch volume.
pub const TMP_VOLUME: &str = "tmp";
/// UID and GID every container runs as.
pub const RUN_AS: i64 = 65532;
/// Size limit of the runner binary's volume.
const BIN_SIZE_LIMIT: &str = "128Mi";

/// Pod-level security: non-root, fixed UID/GID, seccomp `RuntimeDefault`.
pub fn pod_security_context() -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(RUN_AS),
        run_as_group: Some(RUN_AS),
        fs_group: Some(RUN_AS),
        seccomp_profile: Some(runtime_default()),
        ..Default::default()
    }
}

fn runtime_default() -> SeccompProfile {
    SeccompProfile { type_: "RuntimeDefault".into(), localhost_profile: None }
}

/// Container-level security: no privilege escalation, no capabilities, read-only root.
pub fn container_security_context() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        privileged: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        run_as_user: Some(RUN_AS),
        run_as_group: Some(RUN_AS),
        capabilities: Some(Capabilities { drop: Some(vec!["ALL".into()]), add: None }),
        seccomp_profile: Some(runtime_default()),
        ..Default::default()
    }
}

/// The init container that installs the runner into [`BIN_DIR`].
pub fn install_runner_container(runner_image: &str) -> Container {
    Container {
        name: INSTALL_CONTAINER.into(),
        image: Some(runner_image.to_owned()),
        command: Some(INSTALL_COMMAND.iter().map(|s| (*s).to_owned()).collect()),
        security_context: Some(container_security_context()),
        resources: Some(ResourceRequirements {
            requests: Some(quantities(&[("cpu", "10m"), ("memory", "16Mi")])),
            limits: Some(quantities(&[("memory", "128Mi")])),
            ..Default::default()
        }),
        volume_mounts: Some(vec![VolumeMount {
            name: BIN_VOLUME.into(),
            mount_path: BIN_DIR.into(),
            ..Default::default()
        }]),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Default::default()
    }
}

/// Mounts of the main container: the runner (read-only) and `/tmp`.
pub fn main_mounts() -> Vec<VolumeMount> {
    vec![
        VolumeMount {
            name: BIN_VOLUME.into(),
            mount_path: BIN_DIR.into(),
            read_only: Some(true),
            ..Default::default()
        },
        VolumeMount { name: TMP_VOLUME.into(), mount_path: "/tmp".into(), ..Default::default() },
    ]
}

/// The pod's volumes: the runner's emptyDir and a size-limited `/tmp`.
pub fn volumes(tmp_size_limit: &str) -> Vec<Volume> {
    let empty_dir = |limit: &str| EmptyDirVolumeSource { medium: None, size_limit: Some(Quantity(limit.to_owned())) };
    vec![
        Volume { name: BIN_VOLUME.into(), empty_dir: Some(empty_dir(BIN_SIZE_LIMIT)), ..Default::default() },
        Volume { name: TMP_VOLUME.into(), empty_dir: Some(empty_dir(tmp_size_limit)), ..Default::default() },
    ]
}

/// A hardened pod spec around `main` (which gets the security context and mounts here).
pub fn hardened_pod_spec(
    mut main: Container,
    runner_image: &str,
    service_account: Option<&str>,
    tmp_size_limit: &str,
    restart_policy: &str,
) -> PodSpec {
    main.security_context = Some(container_security_context());
    main.volume_mounts = Some(main_mounts());
    main.termination_message_policy = Some("FallbackToLogsOnError".into());
    PodSpec {
        restart_policy: Some(restart_policy.to_owned()),
        automount_service_account_token: Some(false),
        service_account_name: service_account.map(str::to_owned),
        enable_service_links: Some(false),
        security_context: Some(pod_security_context()),
        init_containers: Some(vec![install_runner_container(runner_image)]),
        containers: vec![main],
        volumes: Some(volumes(tmp_size_limit)),
        ..Default::default()
    }
}

/// A tool's pod spec (a call's Job, a warm pool's pods): the hardened shape around `main`,
/// with the tool's ServiceAccount, placement and read-only volumes.
pub fn tool_pod_spec(
    main: Container,
    config: &crate::Config,
    spec: &toolyard_api::McpToolSpec,
    restart_policy: &str,
) -> PodSpec {
    runtime_pod_spec(main, config, &spec.runtime, spec.placement.as_ref(), restart_policy)
}

/// The hardened pod around `main` for a `runtime` (an McpTool's or an McpServer's): its
/// ServiceAccount, `placement` and read-only volumes.
pub fn runtime_pod_spec(
    main: Container,
    config: &crate::Config,
    runtime: &toolyard_api::mcptool::Runtime,
    placement: Option<&toolyard_api::mcptool::Placement>,
    restart_policy: &str,
) -> PodSpec {
    let mut pod = hardened_pod_spec(
        main,
        &config.runner_image,
        runtime.service_account_name.as_deref(),
        &config.resources.tmp_size_limit,
        restart_policy,
    );
    if let Some(placement) = placement {
        pod.node_selector = (!placement.node_selector.is_empty()).then(|| placement.node_selector.clone());
        pod.tolerations = (!placement.tolerations.is_empty()).then(|| placement.tolerations.clone());
        pod.affinity = placement.affinity.clone();
        pod.runtime_class_name = placement.runtime_class_name.clone();
    }
    for v in &runtime.volumes {
        let (volume, mount) = tool_volume(v);
        pod.volumes.get_or_insert_with(Vec::new).push(volume);
        if let Some(main) = pod.containers.first_mut() {
            main.volume_mounts.get_or_insert_with(Vec::new).push(mount);
        }
    }
    pod
}

/// The pod volume and the read-only mount of a tool's volume (named `tool-<name>`, apart
/// from Toolyard's own).
fn tool_volume(v: &toolyard_api::mcptool::ToolVolume) -> (Volume, VolumeMount) {
    let name = format!("tool-{}", v.name);
    let mut volume = Volume { name: name.clone(), ..Default::default() };
    if let Some(c) = &v.config_map {
        volume.config_map = Some(ConfigMapVolumeSource { name: c.name.clone(), ..Default::default() });
    } else if let Some(s) = &v.secret {
        volume.secret = Some(SecretVolumeSource { secret_name: Some(s.name.clone()), ..Default::default() });
    } else if let Some(p) = &v.persistent_volume_claim {
        volume.persistent_volume_claim =
            Some(PersistentVolumeClaimVolumeSource { claim_name: p.name.clone(), read_only: Some(true) });
    }
    let mount = VolumeMount { name, mount_path: v.mount_path.clone(), read_only: Some(true), ..Default::default() };
    (volume, mount)
}

/// A literal environment variable.
pub fn env(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar { name: name.to_owned(), value: Some(value.into()), value_from: None }
}

/// An environment variable from a Secret key.
pub fn secret_env(name: &str, secret: &str, key: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: None,
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector { name: secret.to_owned(), key: key.to_owned(), optional: None }),
            ..Default::default()
        }),
    }
}

/// The tool's own environment, as declared on the McpTool.
pub fn tool_env(vars: &[toolyard_api::mcptool::EnvVar]) -> Vec<EnvVar> {
    vars.iter()
        .map(|v| match (&v.value, &v.secret_key_ref) {
            (_, Some(r)) => secret_env(&v.name, &r.name, &r.key),
            (value, None) => env(&v.name, value.clone().unwrap_or_default()),
        })
        .collect()
}

/// The tracing variables of every run container (`Config::run_telemetry_env`).
pub fn telemetry_env(config: &crate::Config) -> impl Iterator<Item = EnvVar> + '_ {
    config.run_telemetry_env.iter().map(|(name, value)| env(name, value.clone()))
}

/// Resources of the container running `runtime`: its declared ones, else the tool defaults
/// of the controller's config.
pub fn runtime_resources(runtime: &toolyard_api::mcptool::Runtime, config: &crate::Config) -> ResourceRequirements {
    let r = &config.resources;
    resources(runtime.resources.as_ref(), &r.tool_cpu_request, &r.tool_memory_request, &r.tool_memory_limit)
}

/// Resources of a main container: the declared ones verbatim, else the defaults.
pub fn resources(
    declared: Option<&ResourceRequirements>,
    cpu_request: &str,
    memory_request: &str,
    memory_limit: &str,
) -> ResourceRequirements {
    match declared {
        Some(r) if r.requests.is_some() || r.limits.is_some() => r.clone(),
        _ => ResourceRequirements {
            requests: Some(quantities(&[("cpu", cpu_request), ("memory", memory_request)])),
            limits: Some(quantities(&[("memory", memory_limit)])),
            ..Default::default()
        },
    }
}

fn quantities(pairs: &[(&str, &str)]) -> BTreeMap<String, Quantity> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned()))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declared_resources_win_over_defaults() {
        let declared = ResourceRequirements { limits: Some(quantities(&[("memory", "64Mi")])), ..Default::default() };
        assert_eq!(resources(Some(&declared), "100m", "128Mi", "512Mi"), declared);
        let defaults = resources(None, "100m", "128Mi", "512Mi");
        assert_eq!(defaults.requests.unwrap()["cpu"], Quantity("100m".into()));
        assert_eq!(defaults.limits.unwrap()["memory"], Quantity("512Mi".into()));
        let empty = ResourceRequirements::default();
        assert!(resources(Some(&empty), "1", "1Mi", "2Mi").requests.is_some(), "empty means defaults");
    }

    #[test]
    fn tool_env_keeps_values_and_secret_refs() {
        let vars = vec![
            toolyard_api::mcptool::EnvVar { name: "A".into(), value: Some("1".into()), secret_key_ref: None },
            toolyard_api::mcptool::EnvVar {
                name: "B".into(),
                value: None,
                secret_key_ref: Some(toolyard_api::SecretKeyRef { name: "s".into(), key: "k".into() }),
            },
        ];
        let out = tool_env(&vars);
        assert_eq!(out[0], env("A", "1"));
        assert_eq!(out[1], secret_env("B", "s", "k"));
    }
}
