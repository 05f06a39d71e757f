//! What the runner does to itself before anything else, so that the code it runs (a tool, a
//! coding agent's model-written code) cannot reach the run's token or anything else the
//! runner holds:
//!
//! - not dumpable: no other process of the same user reads its environment, memory, open
//!   files or maps through `/proc`, nor attaches to it (only `CAP_SYS_PTRACE` could);
//! - no new privileges: a setuid or file-capability binary grants nothing to it or its
//!   children;
//! - no capabilities: when started as root (the local mode on a machine where the gateway
//!   runs as root), every capability is dropped from its bounding, ambient, inheritable,
//!   effective and permitted sets, so neither it nor what it starts can regain one, and root
//!   code without `CAP_SYS_PTRACE` cannot read a non-dumpable process either. In a pod the
//!   sets are already empty (every capability dropped).

use caps::{CapSet, Capability};

/// Hardens this process; an error says what could not be done.
pub fn harden() -> Result<(), String> {
    nix::sys::prctl::set_dumpable(false).map_err(|e| format!("cannot make the process non-dumpable: {e}"))?;
    nix::sys::prctl::set_no_new_privs().map_err(|e| format!("cannot set no_new_privs: {e}"))?;
    drop_capabilities()
}

fn drop_capabilities() -> Result<(), String> {
    let err = |what: &str, e: caps::errors::CapsError| format!("cannot drop the {what} capabilities: {e}");
    let bounding = caps::read(None, CapSet::Bounding).map_err(|e| err("bounding", e))?;
    if !bounding.is_empty() && caps::has_cap(None, CapSet::Effective, Capability::CAP_SETPCAP).unwrap_or(false) {
        for cap in bounding {
            caps::drop(None, CapSet::Bounding, cap).map_err(|e| err("bounding", e))?;
        }
    }
    caps::clear(None, CapSet::Ambient).map_err(|e| err("ambient", e))?;
    caps::clear(None, CapSet::Inheritable).map_err(|e| err("inheritable", e))?;
    caps::clear(None, CapSet::Effective).map_err(|e| err("effective", e))?;
    caps::clear(None, CapSet::Permitted).map_err(|e| err("permitted", e))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_hardened_process_has_no_capability_left() {
        // In a child process: hardening is for good.
        let exe = std::env::current_exe().expect("test binary");
        if std::env::var_os("TOOLYARD_HARDEN_CHILD").is_some() {
            super::harden().expect("harden");
            for set in
                [caps::CapSet::Effective, caps::CapSet::Permitted, caps::CapSet::Inheritable, caps::CapSet::Ambient]
            {
                assert!(caps::read(None, set).expect("read").is_empty(), "{set:?}");
            }
            // (Per thread, like capabilities: the runner hardens itself before it starts any.)
            let status = std::fs::read_to_string("/proc/thread-self/status").expect("status");
            assert!(status.contains("NoNewPrivs:\t1"), "{status}");
            return;
        }
        let out = std::process::Command::new(exe)
            .args(["--exact", "harden::tests::a_hardened_process_has_no_capability_left", "--nocapture"])
            .env("TOOLYARD_HARDEN_CHILD", "1")
            .output()
            .expect("child");
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
