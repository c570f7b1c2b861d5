//! The synchronous face of the client, for programs without an async runtime.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::client::{Client, CommandMessage, CommandRegistration, Service, ServiceEvent, ServiceOptions, Subscription};
use crate::config::{DialogConfig, parse_control_addrs};
use crate::directory::ProcessInfo;
use crate::error::DialogError;

/// A dialog process, with a blocking API: one or two lines to join the system.
///
/// It runs the async [`Client`] on a small runtime of its own (2 threads by default), where
/// handlers run. Calling these methods from a handler is allowed.
///
/// ```no_run
/// use daqflow_dialog::{Dialog, ServiceEvent};
/// let dialog = Dialog::connect("127.0.0.1:7000", "ru-1")?;
/// let stats = dialog.provide("ru-1/stats")?;
/// let _cmd = dialog.register_command("ru-1/configure", |cmd| println!("configure: {:?}", cmd.data))?;
/// let _sub = dialog.subscribe("evm/state", |e| {
///     if let ServiceEvent::Update { data, .. } = e { println!("evm: {}", String::from_utf8_lossy(&data)) }
/// })?;
/// stats.update(br#"{"events": 1000}"#)?;
/// dialog.send_command("all/stop", b"")?;
/// # Ok::<(), daqflow_dialog::DialogError>(())
/// ```
pub struct Dialog {
    client: Client,
    runtime: Option<Arc<tokio::runtime::Runtime>>,
}

impl std::fmt::Debug for Dialog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dialog").field("client", &self.client).finish()
    }
}

impl Dialog {
    /// Joins the system as process `name`, with the control server at `control`
    /// (`host:port[,host:port…]`, primary then spares) and default settings. Returns at once;
    /// the connection is made in the background, retried as long as needed.
    pub fn connect(control: &str, name: &str) -> Result<Dialog, DialogError> {
        Self::start(DialogConfig::new(name, parse_control_addrs(control)?))
    }

    /// Joins the system with a full configuration.
    pub fn start(config: DialogConfig) -> Result<Dialog, DialogError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(config.worker_threads.max(1))
            .thread_name(format!("dialog-{}", config.name))
            .enable_all()
            .build()
            .map_err(|e| DialogError::Setup {
                context: "starting the dialog runtime".into(),
                message: e.to_string(),
            })?;
        let client = runtime.block_on(Client::start(config))?;
        Ok(Dialog { client, runtime: Some(Arc::new(runtime)) })
    }

    /// The async client underneath, for code running on its runtime.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The runtime the client runs on.
    pub fn runtime(&self) -> &tokio::runtime::Handle {
        self.client.inner().handle()
    }

    fn block<F: std::future::Future>(&self, f: F) -> F::Output {
        self.client.inner().block_on_pub(f)
    }

    /// Whether the process is connected to a control server now.
    pub fn is_connected(&self) -> bool {
        self.client.is_connected()
    }

    /// Waits until connected to a control server, at most `timeout`.
    pub fn wait_connected(&self, timeout: Duration) -> bool {
        self.block(self.client.wait_connected(timeout))
    }

    /// See [`Client::provide`].
    pub fn provide(&self, name: &str) -> Result<Service, DialogError> {
        self.block(self.client.provide(name))
    }

    /// See [`Client::provide_with`].
    pub fn provide_with(&self, name: &str, options: ServiceOptions) -> Result<Service, DialogError> {
        self.block(self.client.provide_with(name, options))
    }

    /// See [`Client::subscribe`].
    pub fn subscribe(
        &self,
        name: &str,
        handler: impl FnMut(ServiceEvent) + Send + 'static,
    ) -> Result<Subscription, DialogError> {
        self.client.subscribe(name, handler)
    }

    /// See [`Client::register_command`].
    pub fn register_command(
        &self,
        name: &str,
        handler: impl FnMut(CommandMessage) + Send + 'static,
    ) -> Result<CommandRegistration, DialogError> {
        self.client.register_command(name, handler)
    }

    /// See [`Client::send_command`].
    pub fn send_command(&self, name: &str, data: &[u8]) -> Result<u32, DialogError> {
        self.block(self.client.send_command(name, Bytes::copy_from_slice(data)))
    }

    /// See [`Client::processes`].
    pub fn processes(&self, timeout: Duration) -> Result<Vec<ProcessInfo>, DialogError> {
        self.block(self.client.processes(timeout))
    }

    /// Leaves the system (also done on drop).
    pub fn shutdown(&self) {
        self.block(self.client.shutdown());
    }
}

impl Drop for Dialog {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            if tokio::runtime::Handle::try_current().is_err() {
                rt.block_on(self.client.shutdown());
            }
            if let Ok(rt) = Arc::try_unwrap(rt) {
                rt.shutdown_timeout(Duration::from_secs(1));
            }
        }
    }
}
