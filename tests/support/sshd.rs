//! Workers for the tests: real OpenSSH servers (`sshd`, Debian's `openssh-server`) on
//! 127.0.0.1, each with its own host key, home directory and root directory standing for a
//! machine of its own, and one client key made for the test.
//!
//! [`SshKey::new`] makes the client key and an ssh client configuration file; [`Sshd::start`]
//! starts a server that accepts that key and adds a `Host <name>` entry for it to the file, so
//! the gateway reaches it as `ssh <name>` with `-F <file>` (its worker's `ssh_config`). Nothing
//! of the user's own `~/.ssh` is read or written. `sshd` runs in the foreground as this test's
//! child and is killed when the [`Sshd`] drops.
//!
//! `sshd` needs root (it checks its privilege separation directory, `/run/sshd`, which is made
//! here when missing); `.ci/run` installs `openssh-server` when `sshd` is missing.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const SSHD: &str = "/usr/sbin/sshd";

/// The test's client key and the ssh client configuration file that names each worker.
pub struct SshKey {
    dir: tempfile::TempDir,
}

impl SshKey {
    pub fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("test-ssh-client-")
            .tempdir()
            .expect("temp dir for the client key");
        keygen(&dir.path().join("id_ed25519"));
        std::fs::write(dir.path().join("config"), "").expect("write the client config");
        Self { dir }
    }

    /// The ssh client configuration file (`ssh -F`).
    pub fn config_file(&self) -> PathBuf {
        self.dir.path().join("config")
    }

    fn private_key(&self) -> PathBuf {
        self.dir.path().join("id_ed25519")
    }

    fn public_key(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("id_ed25519.pub")).expect("public key")
    }

    fn known_hosts(&self) -> PathBuf {
        self.dir.path().join("known_hosts")
    }
}

/// One worker: an `sshd` on 127.0.0.1 that accepts the test's key, with its own home and root.
pub struct Sshd {
    pub name: String,
    pub port: u16,
    /// The home directory its sessions get (`HOME`): the worker's own OpenCode and git
    /// configuration live there.
    pub home: PathBuf,
    /// A directory for the worker's `root` setting.
    pub root: PathBuf,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Sshd {
    /// Starts worker `name` and adds `Host <name>` to `key`'s client configuration.
    pub fn start(name: &str, key: &SshKey) -> Self {
        Self::start_with(name, key, None)
    }

    /// The same, every session running `login` first (sshd's `ForceCommand`, with the
    /// command asked for in `SSH_ORIGINAL_COMMAND`): what a worker's login files (`~/.ssh/rc`,
    /// a profile) do before each command, here without touching any real user's files.
    pub fn start_with(name: &str, key: &SshKey, login: Option<&Path>) -> Self {
        if !Path::new(SSHD).exists() {
            panic!(
                "{SSHD} is missing; the worker tests run real OpenSSH servers: install them with \
                 `apt-get install openssh-server`"
            );
        }
        let privsep = Path::new("/run/sshd");
        if !privsep.exists() {
            std::fs::create_dir_all(privsep).unwrap_or_else(|e| {
                panic!("sshd needs /run/sshd (run the tests as root, or create it): {e}")
            });
        }
        // Not in /tmp: a confined command there has a private /tmp, and the worker's root and
        // home must be in its sight for the tests to prove anything.
        let dir = tempfile::Builder::new()
            .prefix(&format!("test-worker-{name}-"))
            .tempdir_in(super::isolation::test_tmp())
            .expect("temp dir for the worker");
        let home = dir.path().join("home");
        let root = dir.path().join("root");
        std::fs::create_dir_all(&home).expect("worker home");
        std::fs::create_dir_all(&root).expect("worker root");
        let host_key = dir.path().join("host_key");
        keygen(&host_key);
        let authorized = dir.path().join("authorized_keys");
        std::fs::write(&authorized, key.public_key()).expect("authorized_keys");
        let port = super::opencode_server::free_port();
        let user = whoami();
        let config = dir.path().join("sshd_config");
        std::fs::write(
            &config,
            format!(
                "ListenAddress 127.0.0.1\nPort {port}\nHostKey {hk}\nPidFile {pid}\n\
                 AuthorizedKeysFile {authorized}\nAllowUsers {user}\nPasswordAuthentication no\n\
                 KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n\
                 PermitRootLogin prohibit-password\nAllowAgentForwarding no\n\
                 AllowTcpForwarding local\nX11Forwarding no\nPermitTTY no\n\
                 SetEnv HOME={home}\nLogLevel VERBOSE\n{force}",
                force = login
                    .map(|l| format!("ForceCommand {}\n", l.display()))
                    .unwrap_or_default(),
                hk = host_key.display(),
                pid = dir.path().join("sshd.pid").display(),
                authorized = authorized.display(),
                home = home.display(),
            ),
        )
        .expect("sshd_config");
        let log = std::fs::File::create(dir.path().join("sshd.log")).expect("sshd log");
        let child = Command::new(SSHD)
            .arg("-D")
            .arg("-e")
            .arg("-f")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start sshd");
        let mut sshd = Sshd {
            name: name.to_string(),
            port,
            home,
            root,
            dir,
            child: Some(child),
        };
        sshd.wait_listening();
        let public = std::fs::read_to_string(host_key.with_extension("pub")).expect("host key");
        let mut known = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(key.known_hosts())
            .expect("known_hosts");
        writeln!(known, "[127.0.0.1]:{port} {}", public.trim()).expect("write known_hosts");
        let mut client = std::fs::OpenOptions::new()
            .append(true)
            .open(key.config_file())
            .expect("client config");
        write!(
            client,
            "Host {name}\n  HostName 127.0.0.1\n  Port {port}\n  User {user}\n  IdentityFile {id}\n  \
             IdentitiesOnly yes\n  IdentityAgent none\n  UserKnownHostsFile {kh}\n  \
             StrictHostKeyChecking yes\n  GlobalKnownHostsFile /dev/null\n",
            id = key.private_key().display(),
            kh = key.known_hosts().display(),
        )
        .expect("write client config");
        sshd
    }

    /// The worker's own OpenCode setup: a wrapper in its root that runs the pinned OpenCode
    /// with the worker's environment (its own home; here the fake model at `fake_url` as its
    /// provider, and nothing that reaches past 127.0.0.1). Its settings go in its own config
    /// file, as a worker's user keeps them: the gateway gives OpenCode there its confining
    /// shell through `OPENCODE_CONFIG_CONTENT`, which a wrapper setting its own would replace
    /// (and the gateway would then refuse to start confined tasks there).
    pub fn opencode_setup(&self, env: &super::OpenCodeEnv, fake_url: &str) -> PathBuf {
        let word = |v: &str| format!("'{}'", v.replace('\'', "'\\''"));
        let vars = env.vars(fake_url);
        let var = |name: &str| {
            vars.iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
                .unwrap_or_else(|| panic!("{name} is one of the isolated OpenCode's variables"))
        };
        let config_dir = Path::new(&var("XDG_CONFIG_HOME")).join("opencode");
        std::fs::create_dir_all(&config_dir).expect("the worker's OpenCode config dir");
        std::fs::write(
            config_dir.join("opencode.json"),
            var("OPENCODE_CONFIG_CONTENT"),
        )
        .expect("the worker's OpenCode config");
        let mut script = String::from("#!/bin/sh\n");
        for (k, v) in vars.iter().filter(|(k, _)| k != "OPENCODE_CONFIG_CONTENT") {
            script.push_str(&format!("export {k}={}\n", word(v)));
        }
        script.push_str(&format!(
            "exec {} \"$@\"\n",
            word(&super::opencode_bin::opencode_bin().display().to_string())
        ));
        let wrapper = self.root.join("opencode-here");
        std::fs::write(&wrapper, script).expect("write the wrapper");
        std::fs::set_permissions(
            &wrapper,
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .expect("chmod");
        wrapper
    }

    /// Waits (bounded) until the server accepts connections.
    fn wait_listening(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                panic!("sshd exited ({status}): {}", self.log());
            }
            if Instant::now() > deadline {
                panic!("sshd did not listen within 10 s: {}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops answering new connections (the listener is stopped with SIGSTOP: a connection is
    /// taken by the kernel and then nothing is said), as a machine gone off the network would;
    /// sessions already open and what they started run on. [`Self::resume`] undoes it.
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// Answers again after [`Self::pause`].
    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    fn signal(&self, signal: libc::c_int) {
        let pid = self.child.as_ref().map(Child::id).expect("sshd runs");
        let pid = libc::pid_t::try_from(pid).expect("a pid");
        // SAFETY: kill(2) on this test's own sshd child.
        let sent = unsafe { libc::kill(pid, signal) };
        assert_eq!(sent, 0, "signal sshd");
    }

    /// What sshd logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("sshd.log")).unwrap_or_default()
    }

    /// Stops the server (the machine is gone): its sessions too, which `sshd` runs as children
    /// of their own that outlive the listener.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            for pid in super::procs::descendants(child.id()) {
                if let Ok(pid) = libc::pid_t::try_from(pid) {
                    // SAFETY: kill(2) on a session process of this test's sshd.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        self.stop();
    }
}

fn keygen(path: &Path) {
    let out = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "opencode-mcp-test", "-f"])
        .arg(path)
        .output()
        .unwrap_or_else(|e| {
            panic!("ssh-keygen is missing ({e}): install OpenSSH's client (`apt-get install openssh-client`)")
        });
    assert!(
        out.status.success(),
        "ssh-keygen: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn whoami() -> String {
    let out = Command::new("id").arg("-un").output().expect("id -un");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}
