//! Integration tests of the data layer: scraping against a misbehaving
//! server, discovery, engine fixtures, simulator processes, and llm-d's
//! shipped configs with every plugin type this picker registers.

#![expect(clippy::unwrap_used, reason = "test helpers panic on failure")]

mod common;

#[path = "datalayer/dcgm.rs"]
mod dcgm;
#[path = "datalayer/discovery.rs"]
mod discovery;
#[path = "datalayer/fixtures.rs"]
mod fixtures;
#[path = "datalayer/llm_d_configs.rs"]
mod llm_d_configs;
#[path = "datalayer/mtls.rs"]
mod mtls;
#[path = "datalayer/redis_index.rs"]
mod redis_index;
#[path = "datalayer/replicas.rs"]
mod replicas;
#[path = "datalayer/scrape.rs"]
mod scrape;
#[path = "datalayer/sim.rs"]
mod sim;
