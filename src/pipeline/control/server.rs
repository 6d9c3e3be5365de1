//! Stage 5': the session manager — owns the control socket (mode 0660, peer credentials logged),
//! accepts clients and runs one connection task per client ([`super::connection`]).
//!
//! Binding: a stale socket file (nobody accepts on it) is replaced; a live one (another daemon),
//! or one this user cannot connect to, is an error; directories made for it are `0750`. Stopping closes the socket, removes its file and tells every connection to end:
//! each stops its producer, sends `error{shutting_down}` and gives its client
//! `shutdown_grace_secs` to report its last position (`close{taken}`) before it parks the session.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::Arc;

use actix::prelude::*;

use super::connection;
use super::peer::ConnShared;
use super::ControlPlane;
use crate::pipeline::data::delivery::Delivery;
use crate::pipeline::lifecycle::{StageStopped, StopStage};
use crate::stage::Stage;

/// Socket file permissions: owner and group may connect.
pub const SOCKET_MODE: u32 = 0o660;

/// The session manager actor.
pub struct SessionManager {
    shared: Arc<ControlPlane>,
    delivery: Addr<Delivery>,
    supervisor: Recipient<StageStopped>,
    shutdown: tokio::sync::watch::Sender<bool>,
    bound: Option<PathBuf>,
}

impl SessionManager {
    /// A session manager that starts producers through `delivery`.
    #[must_use]
    pub fn new(shared: Arc<ControlPlane>, delivery: Addr<Delivery>, supervisor: Recipient<StageStopped>) -> Self {
        Self { shared, delivery, supervisor, shutdown: tokio::sync::watch::channel(false).0, bound: None }
    }
}

/// Binds the control socket at `path`, replacing a stale socket file.
///
/// # Errors
/// I/O errors, or a live daemon already listening there.
pub fn bind(path: &std::path::Path) -> std::io::Result<std::os::unix::net::UnixListener> {
    if let Some(dir) = path.parent() {
        if !dir.as_os_str().is_empty() {
            create_socket_dir(dir)?;
            warn_if_others_may_replace(dir);
        }
    }
    check_free(path)?;
    if std::fs::symlink_metadata(path).is_ok() {
        std::fs::remove_file(path)?;
    }
    let listener = std::os::unix::net::UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(SOCKET_MODE))?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// Mode of the directories the daemon makes for its socket: the group may reach the socket,
/// nobody else may add or remove files there (found by a probe: made under the umask, `0777` or
/// `0770`, another user could remove the socket and bind an impostor in its place).
pub const SOCKET_DIR_MODE: u32 = 0o750;

/// Makes `dir` and its missing parents, each of them [`SOCKET_DIR_MODE`] whatever the umask.
fn create_socket_dir(dir: &std::path::Path) -> std::io::Result<()> {
    let missing: Vec<&std::path::Path> =
        dir.ancestors().take_while(|d| !d.as_os_str().is_empty() && std::fs::symlink_metadata(d).is_err()).collect();
    std::fs::create_dir_all(dir)?;
    for d in missing.iter().rev() {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(SOCKET_DIR_MODE))?;
    }
    Ok(())
}

/// Warns when users other than this one may remove the socket from `dir` and bind their own:
/// a directory writable by its group or others, without the sticky bit (as `/tmp` has), or
/// another user's.
fn warn_if_others_may_replace(dir: &std::path::Path) {
    use std::os::unix::fs::MetadataExt as _;
    let Ok(meta) = std::fs::metadata(dir) else { return };
    let mode = meta.mode();
    let sticky = mode & 0o1000 != 0;
    let writable_by_others = mode & 0o022 != 0 && !sticky;
    let foreign = meta.uid() != rustix::process::geteuid().as_raw() && meta.uid() != 0;
    if writable_by_others || foreign {
        tracing::warn!(
            dir = %dir.display(),
            mode = %format_args!("{:o}", mode & 0o7777),
            owner = meta.uid(),
            "the control socket's directory lets other users remove the socket and listen in its place (a client would then be served by them): give daemon.socket a directory only this user may write"
        );
    }
}

/// Whether the control socket can be bound at `path` ([`check_free`]), its directory made first
/// if missing and writable by this user: checked at start, so that a daemon that cannot bind its
/// socket stops at once saying why (found by a probe: a directory it could not create was logged
/// six times over three seconds of restarts of the sessions stage, then "stage 'sessions' stopped
/// 6 times within 60s").
///
/// # Errors
/// The directory cannot be made or written; [`check_free`]'s.
pub fn check_bindable(path: &std::path::Path) -> std::io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        let cannot = |what: &str, e: std::io::Error| {
            std::io::Error::new(e.kind(), format!("cannot {what} its directory {}: {e}", dir.display()))
        };
        create_socket_dir(dir).map_err(|e| cannot("create", e))?;
        rustix::fs::access(dir, rustix::fs::Access::WRITE_OK | rustix::fs::Access::EXEC_OK)
            .map_err(|e| cannot("write into", e.into()))?;
    }
    check_free(path)
}

/// Whether the control socket can be bound at `path`: nothing there, or a socket nobody listens
/// on (a stale one, left by a daemon that was killed). Checked once at start too, so that a
/// second daemon configured with the first one's socket stops at once, saying so, rather than
/// restart its sessions stage until it gives up (found by a probe).
///
/// # Errors
/// Something other than a socket is there, or a live daemon listens on it.
pub fn check_free(path: &std::path::Path) -> std::io::Result<()> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        if !meta.file_type().is_socket() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket", path.display()),
            ));
        }
        match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AddrInUse,
                    format!(
                        "another daemon is listening on {}; give each daemon its own daemon.socket",
                        path.display()
                    ),
                ))
            }
            // Nobody listens: stale, replaced.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {}
            // Found by a probe: a socket this user may not connect to (another user's, live) was
            // taken for stale and replaced.
            Err(e) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AddrInUse,
                    format!(
                        "{} is a socket this user cannot connect to ({e}): maybe another user's, live; it is not \
                         replaced — give each daemon its own daemon.socket, or remove it if it is stale",
                        path.display()
                    ),
                ))
            }
        }
    }
    Ok(())
}

impl Actor for SessionManager {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let path = self.shared.config().daemon.socket.clone();
        let listener = match bind(&path).and_then(tokio::net::UnixListener::from_std) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(socket = %path.display(), error = %e, "cannot open the control socket");
                ctx.stop();
                return;
            }
        };
        {
            use std::os::unix::fs::MetadataExt as _;
            let (dev, ino) = std::fs::symlink_metadata(&path).map_or((0, 0), |m| (m.dev(), m.ino()));
            self.shared.socket_device.store(dev, std::sync::atomic::Ordering::Relaxed);
            self.shared.socket_inode.store(ino, std::sync::atomic::Ordering::Relaxed);
        }
        // The canonical path (the configured one may read `conf/../run/x.sock`).
        let shown = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
        tracing::info!(socket = %shown.display(), "listening");
        self.bound = Some(path);
        self.shared.data.health.set_stage_up(&self.shared.data.metrics, Stage::Sessions, true);
        let (tx, _) = tokio::sync::watch::channel(false);
        self.shutdown = tx;
        let conn = Arc::new(ConnShared { shared: self.shared.clone(), delivery: self.delivery.clone() });
        let shutdown = self.shutdown.subscribe();
        ctx.spawn(
            async move {
                loop {
                    match listener.accept().await {
                        Ok((stream, _)) => {
                            actix_rt::spawn(connection::serve(stream, conn.clone(), shutdown.clone()));
                        }
                        Err(e) => {
                            // EMFILE and friends: back off briefly instead of spinning.
                            tracing::warn!(error = %e, "accept failed");
                            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        }
                    }
                }
            }
            .into_actor(self),
        );
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        let _ = self.shutdown.send(true);
        self.remove_socket();
        self.supervisor.do_send(StageStopped(Stage::Sessions));
    }
}

impl SessionManager {
    /// Removes the control socket — only if it is still the one this daemon bound: one bound at
    /// its path since ours was removed is another daemon's (found by a probe: a daemon stopping
    /// after its socket had been removed and another had bound the path unlinked that daemon's
    /// live socket, and no client could reach it).
    fn remove_socket(&mut self) {
        let Some(path) = self.bound.take() else { return };
        match self.shared.socket_at(&path) {
            super::SocketAt::Ours => {
                if let Err(e) = std::fs::remove_file(&path) {
                    tracing::warn!(socket = %path.display(), error = %e, "cannot remove the control socket");
                }
            }
            super::SocketAt::Other => {
                tracing::warn!(socket = %path.display(), "the control socket's path holds another file now (another daemon's socket?): left in place");
            }
            // Removed from under the daemon already (`/healthz` said so).
            super::SocketAt::Gone | super::SocketAt::Unbound => {}
        }
    }
}

impl Handler<StopStage> for SessionManager {
    type Result = ();
    fn handle(&mut self, _: StopStage, ctx: &mut Self::Context) {
        let _ = self.shutdown.send(true);
        self.remove_socket();
        ctx.stop();
    }
}
