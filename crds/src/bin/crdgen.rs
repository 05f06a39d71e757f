//! Writes the CRD YAML from the Rust types: `cargo run -p toolyard-api --bin crdgen [DIR]`.
//!
//! Without `DIR` it writes both `crds/*.yaml` and the Helm chart's copies in
//! `charts/toolyard/crds/`; with `DIR`, only there.

use std::path::PathBuf;

const USAGE: &str = "usage: crdgen [DIR]   (without DIR: crds/ and the chart's crds/)";

fn main() -> std::io::Result<()> {
    let arg = std::env::args_os().nth(1);
    match arg.as_ref().and_then(|a| a.to_str()) {
        Some("--version" | "-V") => {
            println!("crdgen {}", env!("CARGO_PKG_VERSION"));
            return Ok(());
        }
        Some("--help" | "-h") => {
            println!("{USAGE}");
            return Ok(());
        }
        Some(flag) if flag.starts_with('-') => {
            eprintln!("crdgen: unknown option {flag}\n{USAGE}");
            std::process::exit(2);
        }
        _ => {}
    }
    let dirs = match arg {
        Some(dir) => vec![PathBuf::from(dir)],
        None => {
            let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
            vec![crate_dir.clone(), crate_dir.join(toolyard_api::crdgen::CHART_CRDS_DIR)]
        }
    };
    for dir in dirs {
        std::fs::create_dir_all(&dir)?;
        for (file, crd) in toolyard_api::crdgen::all() {
            let path = dir.join(file);
            std::fs::write(&path, toolyard_api::crdgen::render(&crd))?;
            println!("wrote {}", path.display());
        }
    }
    Ok(())
}
