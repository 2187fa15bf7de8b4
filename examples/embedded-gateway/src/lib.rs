//! An OpenAI-compatible reverse proxy that embeds epp-rs directly: no Envoy,
//! no ext_proc. It shows the seams a Rust gateway uses:
//!
//! - **discovery** ([`epp_datalayer::Discovery`]) fills an
//!   [`EndpointStore`];
//! - the **data layer** ([`DataLayer`]) keeps each endpoint's metrics fresh;
//! - the **scheduler** ([`Scheduler`], built from an `EndpointPickerConfig`)
//!   picks an endpoint per request;
//! - the **[`Dispatch`](epp_core::Dispatch)** the result hands out counts the request on its
//!   endpoint until the response ends or the client goes away, so the load
//!   scorers see what this gateway sent between two scrapes.
//!
//! The body is read with epp-extproc's parser (bytes in, model and prompt
//! out) and the response's token usage with its usage reader; neither
//! touches ext_proc messages.
//!
//! ```no_run
//! # async fn run() -> anyhow::Result<()> {
//! use embedded_gateway::{Gateway, GatewayOptions};
//!
//! let options = GatewayOptions {
//!     endpoints: vec!["127.0.0.1:8001".into(), "127.0.0.1:8002".into()],
//!     ..GatewayOptions::default()
//! };
//! let gateway = Gateway::start(options).await?;
//! println!("serving on {}", gateway.local_addr());
//! gateway.stopped().await;
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod proxy;

use std::{net::SocketAddr, sync::Arc, time::Duration};

use anyhow::Context as _;
use epp_core::{
    EndpointSnapshot, EndpointSource, Registry, Scheduler, config::EndpointPickerConfig,
};
use epp_datalayer::{DataLayer, DataLayerOptions, Discovery, EndpointStore, StaticDiscovery};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use proxy::{Proxy, SERVED_BY_HEADER};

/// How to run the gateway.
#[derive(Debug, Clone)]
pub struct GatewayOptions {
    /// Address to listen on (port 0: any free port).
    pub listen: SocketAddr,
    /// Model servers, `ip:port`.
    pub endpoints: Vec<String>,
    /// An `EndpointPickerConfig` (YAML); `None`: the default profile.
    pub config: Option<String>,
    /// Time between two scrapes of an endpoint's metrics.
    pub refresh_interval: Duration,
    /// Largest request body accepted (413 beyond).
    pub max_body_bytes: usize,
}

impl Default for GatewayOptions {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            endpoints: Vec::new(),
            config: None,
            refresh_interval: Duration::from_millis(50),
            max_body_bytes: 16 << 20,
        }
    }
}

/// A running gateway: discovery, data layer, scheduler and the HTTP proxy.
#[derive(Debug)]
pub struct Gateway {
    addr: SocketAddr,
    store: Arc<EndpointStore>,
    stop: CancellationToken,
    server: tokio::task::JoinHandle<()>,
    data_layer: DataLayer,
}

impl Gateway {
    /// Builds the scheduler from the config, discovers the endpoints, starts
    /// scraping them and serves HTTP until [`Self::stop`].
    ///
    /// # Errors
    /// An invalid config or endpoint list, or an address that cannot be bound.
    pub async fn start(options: GatewayOptions) -> anyhow::Result<Self> {
        let mut registry = Registry::new();
        epp_plugins::register_builtins(&mut registry);
        epp_datalayer::register(&mut registry);
        let config = match &options.config {
            Some(text) => EndpointPickerConfig::parse(text, "--config")?,
            None => EndpointPickerConfig::default_config(&registry)?,
        };
        let built = config.build(&registry)?;
        let scheduler = Arc::new(built.scheduler);

        let stop = CancellationToken::new();
        let store = Arc::new(EndpointStore::new());
        StaticDiscovery::parse(&options.endpoints)
            .context("invalid endpoint list")?
            .start(Arc::clone(&store), stop.child_token())?;
        let data_layer = DataLayer::start(
            Arc::clone(&store),
            &built.data_layer,
            DataLayerOptions {
                refresh_interval: options.refresh_interval,
                ..DataLayerOptions::default()
            },
            stop.child_token(),
        )?;

        let listener = TcpListener::bind(options.listen)
            .await
            .with_context(|| format!("cannot listen on {}", options.listen))?;
        let addr = listener.local_addr()?;
        let proxy = Arc::new(Proxy::new(
            scheduler as Arc<Scheduler>,
            Arc::clone(&store) as Arc<dyn EndpointSource>,
            options.max_body_bytes,
        ));
        let server = tokio::spawn(proxy.serve(listener, stop.clone()));
        Ok(Self {
            addr,
            store,
            stop,
            server,
            data_layer,
        })
    }

    /// The address the gateway listens on.
    #[must_use]
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The endpoints as the scheduler sees them (metrics, in-flight counts).
    #[must_use]
    pub fn endpoints(&self) -> Arc<EndpointSnapshot> {
        self.store.snapshot()
    }

    /// Waits until the gateway is stopped (by [`Self::stop`] from another
    /// handle, or Ctrl-C in the binary).
    pub async fn stopped(&self) {
        self.stop.cancelled().await;
    }

    /// Stops serving and scraping.
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.server.await;
        self.data_layer.stop().await;
    }
}
