//! Pinned npm packages the tests need (OpenCode, the MCP TypeScript SDK), installed once under
//! the target dir.
//!
//! Test binaries run as parallel processes, so an install happens under an exclusive file lock
//! (`<dir>/.install.lock`): the first process installs, the others wait and then find the
//! package in place. Nothing here is fetched when the package is already there.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// How often a failing `npm install` is tried in all.
const INSTALL_ATTEMPTS: u32 = 3;

/// One pinned package and where it goes.
pub struct Install<'a> {
    pub package: &'a str,
    pub version: &'a str,
    /// Directory name under the target dir, e.g. `opencode-1.18.33`.
    pub dir_name: &'a str,
    /// What a developer can do instead of letting the suite install it.
    pub skip_hint: &'a str,
}

impl Install<'_> {
    /// Returns `ready(dir)` once it succeeds, installing the package first if it does not yet.
    /// Panics with what to do when npm is missing or fails.
    pub fn ensure<T>(&self, ready: impl Fn(&Path) -> Result<T, String>) -> T {
        let (package, version) = (self.package, self.version);
        let dir = target_dir().join(self.dir_name);
        fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        let lock_path = dir.join(".install.lock");
        let lock = File::create(&lock_path)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", lock_path.display()));
        lock.lock()
            .unwrap_or_else(|e| panic!("cannot lock {}: {e}", lock_path.display()));
        if let Ok(found) = ready(&dir) {
            return found;
        }
        eprintln!(
            "installing {package}@{version} into {} (once)",
            dir.display()
        );
        // npm retries single fetches itself; a whole install is tried up to three times more
        // for a registry that fails for longer (a clean CI machine fetches everything here).
        let mut attempt = 1;
        loop {
            let output = Command::new("npm")
                .arg("install")
                .arg("--prefix")
                .arg(&dir)
                .args(["--no-audit", "--no-fund"])
                .arg(format!("{package}@{version}"))
                .stdin(Stdio::null())
                .output()
                .unwrap_or_else(|e| {
                    panic!(
                        "cannot run npm to install {package}@{version}: {e}. Install Node.js \
                         with npm (https://nodejs.org), or {}.",
                        self.skip_hint
                    )
                });
            if output.status.success() {
                break;
            }
            let failure = format!(
                "`npm install --prefix {} {package}@{version}` failed ({}):\n{}\n{}",
                dir.display(),
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr),
            );
            if attempt == INSTALL_ATTEMPTS {
                panic!(
                    "{failure}\nTried {attempt} times. Fix npm's access to its registry, or {}.",
                    self.skip_hint
                );
            }
            eprintln!("{failure}\ntrying again in {}s", 5 * attempt);
            // A pause before the next try, not a wait for anything the test could observe.
            std::thread::sleep(std::time::Duration::from_secs(5 * attempt as u64));
            attempt += 1;
        }
        ready(&dir).unwrap_or_else(|e| {
            panic!(
                "npm installed {package}@{version}, but it is not usable: {e}; {}",
                self.skip_hint
            )
        })
        // `lock` is released when it is dropped here.
    }
}

/// The cargo target dir (where `cargo test` builds), for installs that outlive one run.
pub fn target_dir() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    match std::env::var_os("CARGO_TARGET_DIR").filter(|v| !v.is_empty()) {
        // Cargo resolves a relative CARGO_TARGET_DIR against its working directory, which for
        // `cargo test` in this crate is the manifest directory.
        Some(dir) => manifest.join(dir),
        None => manifest.join("target"),
    }
}
