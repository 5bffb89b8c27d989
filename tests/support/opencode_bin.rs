//! Finding the OpenCode binary the tests run against.
//!
//! The suite pins one OpenCode version: the one `openapi/opencode.json` came from, written in
//! `openapi/OPENCODE_VERSION`. [`opencode_bin`] returns `$OPENCODE_BIN` when set; otherwise it
//! installs npm `opencode-ai@<version>` once into `<target dir>/opencode-<version>/` and returns
//! `node_modules/.bin/opencode` from there (see [`super::npm`] for how installs are shared between
//! the test processes).

use std::fs;
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

fn install_pinned(version: &str) -> PathBuf {
    let install = super::npm::Install {
        package: "opencode-ai",
        version,
        dir_name: &format!("opencode-{version}"),
        skip_hint: "set OPENCODE_BIN to an OpenCode binary of that version",
    };
    install.ensure(|dir| {
        let bin = dir.join("node_modules/.bin/opencode");
        match version_of(&bin) {
            Ok(v) if v == version => Ok(bin),
            Ok(v) => Err(format!(
                "{} prints version {v}, expected {version}",
                bin.display()
            )),
            Err(e) => Err(e),
        }
    })
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
