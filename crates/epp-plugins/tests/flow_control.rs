//! Flow control over llm-d's built-in policies: the order requests leave
//! 10,000-deep queues in, and what a queued request costs in memory.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use epp_plugins::builtin_registry;
use epp_test_support::flow::{Queued, controller};

const N: usize = 10_000;

/// A queued request holds at most 2 KiB in the controller (its slot, its
/// queue entry, its share of the flow and band maps; here also the test's
/// own ticket and waker), besides its body, which the controller never
/// copies.
#[test]
fn a_queued_request_costs_under_2_kib() {
    let registry = builtin_registry();
    let (fc, switch) = controller(
        &registry,
        "round-robin-fairness-policy",
        "edf-ordering-policy",
    );
    let mut queued = None;
    let info = allocation_counter::measure(|| {
        queued = Some(Queued::fill(fc, switch, N, 100, 4));
    });
    let per_request = info.bytes_current as f64 / N as f64;
    println!("bytes per queued request: {per_request:.0}");
    assert!(
        per_request <= 2048.0,
        "{per_request} bytes per queued request"
    );
    assert_eq!(queued.unwrap().fc.len(), N);
}

/// Round robin serves each tenant in turn whatever its backlog; global
/// strict (FCFS) serves in arrival order across tenants; higher bands first.
#[test]
fn release_order_follows_the_policies() {
    let registry = builtin_registry();
    let (fc, switch) = controller(
        &registry,
        "round-robin-fairness-policy",
        "fcfs-ordering-policy",
    );
    // 3 tenants, request i belongs to tenant i % 3, one band.
    let mut q = Queued::fill(fc, switch, 9, 3, 1);
    let order = q.drain();
    let tenants: Vec<usize> = order.iter().map(|i| i % 3).collect();
    assert_eq!(tenants, [0, 1, 2, 0, 1, 2, 0, 1, 2]);

    let (fc, switch) = controller(
        &registry,
        "global-strict-fairness-policy",
        "fcfs-ordering-policy",
    );
    let mut q = Queued::fill(fc, switch, N, 100, 1);
    let order = q.drain();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "arrival order");

    // Two bands (priorities 0 and 1 alternate): every priority-1 request first.
    let (fc, switch) = controller(
        &registry,
        "global-strict-fairness-policy",
        "fcfs-ordering-policy",
    );
    let mut q = Queued::fill(fc, switch, 10, 2, 2);
    let order = q.drain();
    assert_eq!(order, [1, 3, 5, 7, 9, 0, 2, 4, 6, 8]);
}
