//! Finding the OpenCode binary the tests run against.
//!
//! The suite pins one OpenCode version: the one `openapi/opencode.json` came from, written in
//! `openapi/OPENCODE_VERSION`. [`opencode_bin`] returns `$OPENCODE_BIN` when set; otherwise it
//! installs npm `opencode-ai@<version>` once into `<target dir>/opencode-<version>/` and returns
//! `node_modules/.bin/opencode` from there. Test binaries run as parallel processes, so the install
//! happens under an exclusive file lock (`<dir>/.install.lock`); the first process installs, the
//! others wait and then find the binary in place.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// The OpenCode version the suite is pinned to (`openapi/OPENCODE_VERSION`).
pub fn pinned_version() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("openapi/OPENCODE_VERSION");
    let text = fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read the pinned OpenCode version {}: {e}",
            path.display()
        )
    });
    let version = text.trim().to_owned();
    assert!(!version.is_empty(), "{} is empty", path.display());
    version
}

/// The `opencode` executable for tests: `$OPENCODE_BIN` if set, else the pinned npm package,
/// installed on first use. Panics with instructions when neither works.
pub fn opencode_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(locate).clone()
}

fn locate() -> PathBuf {
    let pinned = pinned_version();
    if let Some(bin) = std::env::var_os("OPENCODE_BIN").filter(|v| !v.is_empty()) {
        let bin = PathBuf::from(bin);
        let version = version_of(&bin)
            .unwrap_or_else(|e| panic!("OPENCODE_BIN={} does not run: {e}", bin.display()));
        if version != pinned {
            eprintln!(
                "warning: OPENCODE_BIN={} is OpenCode {version}; the suite is pinned to {pinned}",
                bin.display()
            );
        }
        return bin;
    }
    install_pinned(&pinned)
}

fn target_dir() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    match std::env::var_os("CARGO_TARGET_DIR").filter(|v| !v.is_empty()) {
        // Cargo resolves a relative CARGO_TARGET_DIR against its working directory, which for
        // `cargo test` in this crate is the manifest directory.
        Some(dir) => manifest.join(dir),
        None => manifest.join("target"),
    }
}

// `File::lock` is stable since Rust 1.89; the crate's `rust-version` may say less.
fn install_pinned(version: &str) -> PathBuf {
    let dir = target_dir().join(format!("opencode-{version}"));
    let bin = dir.join("node_modules/.bin/opencode");
    fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
    let lock_path = dir.join(".install.lock");
    let lock = File::create(&lock_path)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", lock_path.display()));
    lock.lock()
        .unwrap_or_else(|e| panic!("cannot lock {}: {e}", lock_path.display()));

    if version_of(&bin).as_deref() == Ok(version) {
        return bin;
    }
    eprintln!(
        "installing opencode-ai@{version} into {} (once; set OPENCODE_BIN to skip)",
        dir.display()
    );
    let output = Command::new("npm")
        .arg("install")
        .arg("--prefix")
        .arg(&dir)
        .args(["--no-audit", "--no-fund"])
        .arg(format!("opencode-ai@{version}"))
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run npm to install opencode-ai@{version}: {e}. Install Node.js with npm \
                 (https://nodejs.org), or set OPENCODE_BIN to an OpenCode {version} binary."
            )
        });
    if !output.status.success() {
        panic!(
            "`npm install --prefix {} opencode-ai@{version}` failed ({}):\n{}\n{}\nFix npm's \
             access to its registry, or set OPENCODE_BIN to an OpenCode {version} binary.",
            dir.display(),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
        );
    }
    match version_of(&bin) {
        Ok(v) if v == version => bin,
        Ok(v) => panic!("{} prints version {v}, expected {version}", bin.display()),
        Err(e) => panic!(
            "npm installed opencode-ai@{version} but {} does not run: {e}. Set OPENCODE_BIN to \
             an OpenCode {version} binary.",
            bin.display()
        ),
    }
    // `lock` is released when it is dropped here.
}

/// Runs `<bin> --version` in an empty environment (plus PATH and a throwaway HOME) and returns
/// the version it prints.
fn version_of(bin: &Path) -> Result<String, String> {
    if !bin.exists() {
        return Err(format!("{} does not exist", bin.display()));
    }
    let home = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
    let mut cmd = Command::new(bin);
    cmd.arg("--version")
        .env_clear()
        .env("HOME", home.path())
        .env("XDG_CONFIG_HOME", home.path().join("config"))
        .env("XDG_DATA_HOME", home.path().join("data"))
        .env("XDG_CACHE_HOME", home.path().join("cache"))
        .env("XDG_STATE_HOME", home.path().join("state"))
        .env("OPENCODE_DISABLE_AUTOUPDATE", "1")
        .stdin(Stdio::null());
    if let Some(path) = std::env::var_os("PATH") {
        cmd.env("PATH", path);
    }
    let output = cmd
        .output()
        .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
    if !output.status.success() {
        return Err(format!(
            "{} --version exited with {}: {}",
            bin.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    // The version is the last line; a first run may print notices before it.
    Ok(stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
        .to_owned())
}
