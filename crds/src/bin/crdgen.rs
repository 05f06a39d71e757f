//! Writes `crds/*.yaml` from the Rust types: `cargo run -p toolyard-api --bin crdgen [DIR]`.

use std::path::PathBuf;

fn main() -> std::io::Result<()> {
    let dir =
        std::env::args_os().nth(1).map(PathBuf::from).unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    for (file, crd) in toolyard_api::crdgen::all() {
        let path = dir.join(file);
        std::fs::write(&path, toolyard_api::crdgen::render(&crd))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
