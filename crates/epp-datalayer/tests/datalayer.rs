//! Integration tests of the data layer: scraping against a misbehaving
//! server, discovery, engine fixtures, and simulator processes.

#![expect(clippy::unwrap_used, reason = "test helpers panic on failure")]

mod common;

#[path = "datalayer/discovery.rs"]
mod discovery;
#[path = "datalayer/fixtures.rs"]
mod fixtures;
#[path = "datalayer/scrape.rs"]
mod scrape;
#[path = "datalayer/sim.rs"]
mod sim;
