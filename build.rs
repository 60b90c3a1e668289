//! Rebuilds when a file of the dashboard changes, is added or is removed: they are embedded
//! in the binary (`src/api/dashboard.rs`), and the embedding alone does not tell cargo about
//! files added since the last build.
fn main() {
    println!("cargo:rerun-if-changed=dashboard");
}
