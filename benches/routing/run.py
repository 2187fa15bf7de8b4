#!/usr/bin/env python3
"""Routing-quality benchmark: the same workloads through each router on the
same simulated fleet, one contender at a time, on fresh simulators.

Contenders: Envoy + epp (default config), Envoy + the reference picker (GIE
v1.5.0 cmd/epp, built by scripts/reference-epp.sh, following an InferencePool
on the test control plane of scripts/kube-env.sh, with the same config file),
Envoy round-robin, sglang-router (cache_aware and power_of_two) and vllm-router
(cache_aware). Client:
inference-perf (poisson arrivals, one stage per request rate). Prefix-cache hit
rates and the spread of requests over servers come from the simulators' own
/metrics, polled during the run and cut at inference-perf's stage times.

Run it through benches/routing/run.sh (installs the tools, builds release
binaries). Direct use:

    .venv/bin/python benches/routing/run.py --out DIR [--workloads a,b]
        [--contenders a,b] [--repeats N] [--quick] [--bin-dir target/release]
        [--reference-args '--v=1']

epp logs at RUST_LOG=warn into each run's epp.log; EPP_BENCH_RUST_LOG overrides it
(e.g. `warn,epp_plugins::predicted_latency_producer=debug`: every candidate's
predicted latencies and the load they were predicted for). EPP_BENCH_DECISIONS=N
has every epp replica keep its last N decisions (every request, every candidate's
scores: the decision view) and writes them, when the contender stops, to the run's
decisions-<replica>.json.

An epp contender named with a suffix -x2 or -x3 (`epp-x2`, `epp-precise-x3`)
runs as that many epp replicas behind one Envoy (its ext_proc cluster round-robins);
with -peers before it (`epp-peers-x2`, `epp-precise-peers-x3`) the replicas share their
in-flight load and picks (`udp-peer-syncer`). With -standby before the -xN
(`epp-precise-peers-standby-x2`) every replica but the first is in Envoy's failover
priority: it runs, scrapes, subscribes and syncs as a replica does, but routes nothing
(a control: several replicas' cost to the machine without their split routing).

Writes DIR/results.jsonl (one line per workload x contender x repeat x rate)
and, through report.py, DIR/report.md and DIR/ttft_p90.png.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import re
from collections import defaultdict
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
N_SIMS = 4
ADAPTERS = [f"adapter-{i}" for i in range(8)]
WARMUP_RATE, WARMUP_SECS = 8, 8

# The simulated fleet (docs/BENCHMARKS.md explains the choice): small batches
# and a 20 ms decode step put the saturation of cache-affine routing at a rate
# this 2-core machine can offer (~40 req/s); 2,048 KV blocks of 16 tokens hold
# about five tenants' ~5,500-token prefixes per server.
SIM_ARGS = [
    "--max-num-seqs", "8",
    "--itl-ms", "20",
    "--ttft-ms", "10",
    "--prefill-us-per-token", "20",
    "--num-gpu-blocks", "2048",
    "--block-size", "16",
    "--seed", "1",
]


# The same fleet built from llm-d's simulator (llm-d-inference-sim, a Go module; `--fleet llm-d-sim`):
# its default latency model with no fixed TTFT is prefill overhead + uncached prompt tokens x the
# per-token time, then one inter-token latency per output token, as epp-sim's is. It tokenizes with
# its own stand-in tokenizer (the model is not fetched), so its token counts, and with them its KV
# blocks, differ from epp-sim's; it binds every address, so each simulator has its own port on
# 127.0.0.1.
LLMD_SIM_ARGS = [
    "--max-num-seqs", "8",
    "--max-model-len", "32768",  # its default, 1,024 tokens, refuses the shared-prefix prompts
    "--inter-token-latency", "20ms",
    "--prefill-overhead", "10ms",
    "--prefill-time-per-token", "20us",
    "--enable-kvcache",
    "--kv-cache-size", "2048",
    "--block-size", "16",
    "--seed", "1",
]
FLEETS = ("epp-sim", "llm-d-sim")

@dataclass
class Workload:
    name: str
    description: str
    rates: list[float]
    stage_secs: int
    data: dict
    sim_args: list[str] = field(default_factory=list)
    lora: bool = False
    # inference-perf, or the Rust load generator (crates/epp-bin/benches/routing.rs).
    client: str = "inference-perf"
    # Traffic the router never sees: (requests/s per simulator, prompt tokens) of unique
    # prompts sent straight to every simulator while the stages run (SideLoad).
    side_load: tuple[float, int] | None = None
    # A second gateway on the same pool that the router never sees: requests/s, in total, of the
    # workload's own requests (its tenants) sent by the Rust client straight to a simulator
    # chosen at random per request (its `--side`).
    side_gateway: float = 0.0
    # How many simulators the fleet has.
    sims: int = N_SIMS
    # Per simulator, how much slower than SIM_ARGS it runs (every time in it multiplied: fixed
    # TTFT, prefill per token, decode step); empty: all alike. epp-sim fleets only.
    speeds: list[float] = field(default_factory=list)
    # The Rust client's request shape, when it is not the workload's name.
    shape: str = ""


# The SIM_ARGS times a simulator `slower` times slower takes.
SIM_TIMES = ("--itl-ms", "--ttft-ms", "--prefill-us-per-token")


def sim_args_at(slower: float) -> list[str]:
    out = list(SIM_ARGS)
    for i, arg in enumerate(out[:-1]):
        if arg in SIM_TIMES:
            out[i + 1] = f"{float(out[i + 1]) * slower:g}"
    return out


# inference-perf's random data: mixed prompt and output lengths, nothing shared.
MIXED_LENGTHS = {
    "type": "random",
    "input_distribution": {"min": 64, "max": 4000, "mean": 1000, "std_dev": 800},
    "output_distribution": {"min": 8, "max": 64, "mean": 32, "std_dev": 16},
}

def shared_prefix(groups: int, per_group: int, system_len: int, question_len: int, output_len: int) -> dict:
    """inference-perf's shared-prefix data: `groups` tenants, each a system prompt
    of `system_len` tokens shared by `per_group` questions."""
    return {
        "type": "shared_prefix",
        "shared_prefix": {
            "num_groups": groups,
            "num_prompts_per_group": per_group,
            "system_prompt_len": system_len,
            "question_len": question_len,
            "output_len": output_len,
            "seed": 1,
        },
    }


WORKLOADS = {
    "shared-prefix": Workload(
        name="shared-prefix",
        description="16 tenants x ~6,000-token shared system prompt (client tokens; ~5,500 by the "
        "simulator's 4-byte rule) + 32-token question, 32 output tokens, streamed completions",
        rates=[8, 16, 24, 32, 40],
        stage_secs=10,
        data=shared_prefix(groups=16, per_group=12, system_len=6000, question_len=32, output_len=32),
    ),
    "no-sharing": Workload(
        name="no-sharing",
        description="random prompts, lengths 64-4,000 tokens (lognormal-ish, mean 1,000), outputs "
        "8-64 tokens (mean 32), nothing shared, streamed completions",
        rates=[8, 16, 24],
        stage_secs=10,
        data=MIXED_LENGTHS,
    ),
    # Shapes the default profile's fixed weights were not tuned on (issue 15).
    "many-tenants": Workload(
        name="many-tenants",
        description="64 tenants x ~6,000-token shared system prompt + 32-token question, 32 output "
        "tokens: four times the prefixes the fleet's KV cache holds, streamed completions",
        rates=[8, 16, 24],
        stage_secs=10,
        data=shared_prefix(groups=64, per_group=4, system_len=6000, question_len=32, output_len=32),
    ),
    "short-prompts": Workload(
        name="short-prompts",
        description="32 tenants x 256-token shared system prompt + 32-token question, 8 output "
        "tokens, up to saturation, streamed completions",
        rates=[40, 80, 120],
        stage_secs=10,
        data=shared_prefix(groups=32, per_group=16, system_len=256, question_len=32, output_len=8),
    ),
    "long-outputs": Workload(
        name="long-outputs",
        description="random prompts, lengths 64-2,000 tokens (mean 500), outputs 64-256 tokens "
        "(mean 160), nothing shared: decode-bound, streamed completions",
        rates=[2, 4, 6],
        stage_secs=10,
        data={
            "type": "random",
            "input_distribution": {"min": 64, "max": 2000, "mean": 500, "std_dev": 400},
            "output_distribution": {"min": 64, "max": 256, "mean": 160, "std_dev": 48},
        },
    ),
    "lora-mix": Workload(
        name="lora-mix",
        description="as no-sharing, but each request names one of 8 LoRA adapters (uniform); each "
        "server holds 2 resident adapters and loads one in 50 ms",
        rates=[4, 8, 12],
        stage_secs=10,
        data=MIXED_LENGTHS,
        sim_args=["--lora-modules", ",".join(ADAPTERS), "--max-loras", "2", "--lora-load-ms", "50"],
        lora=True,
        # inference-perf refuses adapters the router's /v1/models does not list, and
        # sglang-router 0.3 lists only the base model there (it routes adapters fine).
        client="rust",
    ),
}

# Run only when named in --workloads.
EXTRA_WORKLOADS = {
    # Issue 16: engines that cache their outputs' blocks too (vLLM does), so long answers crowd
    # cached prompts out while an index of prompts alone still counts them. With inference-perf's
    # wandering send rate it showed nothing readable; with the Rust client's fixed arrivals the
    # precise index's p90 is below the approximate one's at every rate (docs/BENCHMARKS.md, "Long
    # answers again"). Near saturation only, so it is not in the default run; 40 s stages.
    "long-answers": Workload(
        name="long-answers",
        description="64 tenants x ~2,000-token shared system prompt + 32-token question, 256 output "
        "tokens; the simulators cache output blocks as vLLM does (--cache-output-blocks), so the "
        "prompts (about the fleet's KV cache) and the answers do not fit together, streamed completions",
        rates=[3, 4, 5],
        stage_secs=40,
        data=shared_prefix(groups=64, per_group=4, system_len=2000, question_len=32, output_len=256),
        sim_args=["--cache-output-blocks"],
    ),
    # Issue 16: the fleet's KV cache churned by traffic that does not pass this router (another
    # gateway on the same pool, clients calling servers directly): engines evict tenants' prompts
    # an index of its own picks still counts, while the engines' KV events report it. It did not
    # show the approximate index misled either (docs/BENCHMARKS.md, "Traffic the router does not
    # see"), so it is not in the default run.
    "unseen-load": Workload(
        name="unseen-load",
        description="16 tenants x ~6,000-token shared system prompt + 32-token question, 32 output "
        "tokens (as shared-prefix), while each simulator also serves 1 req/s of unique 4,000-token "
        "prompts sent to it directly, past the router (1 output token): a server's KV cache turns "
        "over in ~8 s, streamed completions",
        rates=[8, 16, 24],
        stage_secs=20,
        data=shared_prefix(groups=16, per_group=12, system_len=6000, question_len=32, output_len=32),
        side_load=(1.0, 4000),
    ),
    # Issue 16: two gateways on one pool, and this router sees one. The other sends the same
    # tenants' requests to servers at random, so the servers' caches hold tenants where this
    # router never sent them and evict those it did: an index of its own picks still counts
    # what is gone and knows nothing of the copies elsewhere; the engines' KV events say both.
    # Eight servers, each holding about a third of the tenants: a tenant is usually cached
    # somewhere, often not where this router last sent it (docs/BENCHMARKS.md, "Two gateways").
    "two-gateways": Workload(
        name="two-gateways",
        description="as shared-prefix (16 tenants x ~6,000-token system prompt + 32-token question, 32 "
        "output tokens) on eight simulators (each caches about five tenants' prompts), while a second "
        "gateway that the router never sees sends 16 req/s of the same tenants' requests straight to a "
        "simulator chosen at random; TTFT and hit rate are the router's requests alone, streamed "
        "completions",
        rates=[4, 8, 16],
        stage_secs=30,
        data=shared_prefix(groups=16, per_group=12, system_len=6000, question_len=32, output_len=32),
        client="rust",
        shape="shared-prefix",
        sims=8,
        side_gateway=16.0,
    ),
    # Issue 15: a fleet of two hardware generations. Routers that count queues but not speed see a
    # slow server only through its queue (they sent the fast pair 61-66 % of the requests); a picker
    # that learns each server's latency sends it less before a queue forms (77-79 % below capacity).
    "mixed-speeds": Workload(
        name="mixed-speeds",
        description="as no-sharing (random prompts, 64-4,000 tokens, outputs 8-64, nothing shared), on a "
        "fleet of two kinds: sim-2 and sim-3 take twice as long for everything (fixed TTFT, prefill, "
        "decode step), streamed completions",
        rates=[8, 16, 24],
        stage_secs=10,
        data=MIXED_LENGTHS,
        speeds=[1.0, 1.0, 2.0, 2.0],
        shape="no-sharing",
    ),
}

CONTENDERS = [
    "epp",
    "reference",
    "round-robin",
    "sglang-cache-aware",
    "sglang-power-of-two",
    "vllm-cache-aware",
]

# epp with another config, run only when named in --contenders: the same
# binary, so a comparison with "epp" isolates the config. Both are epp's
# default config (the reference's default profile) with one change.
EPP_DEFAULT_PROFILE = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer{queue}
- type: kv-cache-utilization-scorer{kv}
- type: prefix-cache-scorer{extra_plugin}
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - {{pluginRef: queue-scorer, weight: 2}}
  - {{pluginRef: kv-cache-utilization-scorer, weight: 2}}
  - {{pluginRef: prefix-cache-scorer, weight: 3}}{extra_ref}
  - {{pluginRef: max-score-picker}}
"""
SCRAPED_ONLY = "\n  parameters: {countDispatched: false}"
EPP_VARIANTS = {
    # The reference's signals: scraped queue and KV only, stale between scrapes.
    "epp-scraped-only": EPP_DEFAULT_PROFILE.format(
        queue=SCRAPED_ONLY, kv=SCRAPED_ONLY, extra_plugin="", extra_ref=""),
    # Dispatched requests counted in the queue signal only; KV as scraped.
    "epp-kv-scraped": EPP_DEFAULT_PROFILE.format(
        queue="", kv=SCRAPED_ONLY, extra_plugin="", extra_ref=""),
    # The default profile plus lora-affinity-scorer (for the LoRA mix).
    "epp-lora": EPP_DEFAULT_PROFILE.format(
        queue="", kv="", extra_plugin="\n- type: lora-affinity-scorer",
        extra_ref="\n  - {pluginRef: lora-affinity-scorer, weight: 2}"),
    # Routing by learned latency (issue 15): the example config as shipped.
    "epp-latency": (ROOT / "examples/configs/predicted-latency.yaml").read_text(),
}


def scorer_entries(scorer: str, weight: int) -> tuple[str, str]:
    """A scorer's plugin and profile entry, in predicted-latency.yaml's layout."""
    return f"- type: {scorer}\n", f"  - pluginRef: {scorer}\n    weight: {weight}\n"


def example_edited(*edits: tuple[str, str]) -> str:
    """The example profile (epp-latency) with each `(old, new)` of `edits` made; fails loudly if
    predicted-latency.yaml no longer has an `old` exactly once."""
    text = EPP_VARIANTS["epp-latency"]
    for old, new in edits:
        assert text.count(old) == 1, f"predicted-latency.yaml: {old!r} moved"
        text = text.replace(old, new)
    return text


def example_with_params(*plugin_params: tuple[str, str]) -> str:
    """The example profile with `parameters: {params}` given to each `(plugin, params)`'s plugin."""
    entries = ((f"- type: {plugin}\n", params) for plugin, params in plugin_params)
    return example_edited(*((e, e + f"  parameters: {{{params}}}\n") for e, params in entries))


def scorer_alone(scorer: str, params: str = "", needs: str = "") -> str:
    """A profile of `scorer` alone (weight 1; `parameters: {params}` when given) and
    max-score-picker, after the plugins `needs` names (e.g. its producer)."""
    parameters = f"\n  parameters: {{{params}}}" if params else ""
    needed = f"- type: {needs}\n" if needs else ""
    return f"""\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
{needed}- type: {scorer}{parameters}
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - {{pluginRef: {scorer}, weight: 1}}
  - {{pluginRef: max-score-picker}}
"""


def example_reweighted(scorer: str, was: int, now: int) -> str:
    """The example profile with `scorer`'s weight `was` changed to `now`."""
    return example_edited((scorer_entries(scorer, was)[1], scorer_entries(scorer, now)[1]))


# Two steps away from the example profile's weights, tried on short-prompts 120 (issue 15):
# tenants held less to the servers epp sent them to (prefix x1), and the queue weighed against a
# prefix match as heavily as the latency score (queue x4).
EPP_VARIANTS["epp-latency-prefix1"] = example_reweighted("prefix-cache-scorer", 3, 1)
EPP_VARIANTS["epp-latency-queue4"] = example_reweighted("queue-scorer", 2, 4)

# In-flight counts (issue 15, short-prompts 120): llm-d's active-request-scorer (this picker's
# requests in flight) in queue-scorer's place; running-requests-size-scorer beside it (together
# the two see every request in flight, running then waiting, each scaled to the candidates' range).
_queue = scorer_entries("queue-scorer", 2)
for _w in (2, 4):
    EPP_VARIANTS[f"epp-latency-active{_w}"] = example_edited(
        *zip(_queue, scorer_entries("active-request-scorer", _w)))
EPP_VARIANTS["epp-latency-running2"] = example_edited(
    *((q, q + r) for q, r in zip(_queue, scorer_entries("running-requests-size-scorer", 2))))
# The example profile with prefix-cache-scorer scoring the matched length in tokens rather than the
# matched fraction (llm-d's matchLengthWeight 1, its length term squared, full from 4,096 tokens): a
# hit of a short prompt saves little prefill and then weighs little beside the load (issue 15,
# short-prompts 120, where epp's requests in flight alone beat every profile with a cache signal).
_BY_LENGTH = ("prefix-cache-scorer", "matchLengthWeight: 1, matchLengthScaleTokens: 4096")
_OWN = ("latency-scorer", "delayToOthersWeight: 0")
EPP_VARIANTS["epp-latency-length"] = example_with_params(_BY_LENGTH)
# The example profile with latency-scorer ranking by each request's own latency only (llm-d's way:
# `delayToOthersWeight: 0`), and with epp's requests in flight beside its queue score
# (`active-request-scorer` x2 added): two ways to let the load outweigh a short prompt's cache
# hit (issue 15, short-prompts 120).
EPP_VARIANTS["epp-latency-own"] = example_with_params(_OWN)
# Both at once: no delay to others and the prefix by length, so that neither the latency score
# (which prices a miss's prefill once for every request at the server) nor the prefix score holds a
# short prompt to a busier server (issue 15, short-prompts 120).
EPP_VARIANTS["epp-latency-own-length"] = example_with_params(_OWN, _BY_LENGTH)
# latency-scorer alone, with and without the delay to others: how well the latency model balances
# on its own (issue 15, short-prompts 120).
EPP_VARIANTS["epp-latency-alone"] = scorer_alone("latency-scorer", needs="predicted-latency-producer")
EPP_VARIANTS["epp-latency-alone-own"] = scorer_alone(
    *_OWN, needs="predicted-latency-producer")
EPP_VARIANTS["epp-latency-plus-active2"] = example_edited(
    *((q, q + a) for q, a in zip(_queue, scorer_entries("active-request-scorer", 2))))
# Join-shortest-queue through the ext_proc path (issue 15, short-prompts 120): epp's own requests in
# flight alone, no cache signal. What a picker behind Envoy gets from balancing alone, to set beside
# vllm-router (which proxies itself and is a shortest-queue router at that rate) and Envoy's round robin.
EPP_VARIANTS["epp-inflight-only"] = scorer_alone("active-request-scorer")
# The waits for a place a request adds to the requests sent to its server while it is there,
# priced by the latency model, counted in its delay to others (issue 15): `placeDelayWeight` W of
# predicted-latency-producer.
for _w in (1, 2):
    EPP_VARIANTS[f"epp-latency-place{_w}"] = example_with_params(
        ("predicted-latency-producer", f"placeDelayWeight: {_w}"))
# The example profile with no price for the cached prompts a miss evicts (`displacedCacheWeight: 0`):
# whether that price is what sends short-prompts 120's requests to busier servers (issue 15).
EPP_VARIANTS["epp-latency-nodisplace"] = example_with_params(
    ("predicted-latency-producer", "displacedCacheWeight: 0"))
# The default profile with latency-scorer beside its scorers at weight W: the weight sweep of
# docs/BENCHMARKS.md ("The default profile's scorers with latency-scorer beside them"); W = 4 is
# the example profile, "epp-latency".
for _w in (2, 3, 4):
    EPP_VARIANTS[f"epp-blend{_w}"] = EPP_DEFAULT_PROFILE.format(
        queue="", kv="",
        extra_plugin="\n- type: predicted-latency-producer\n- type: latency-scorer",
        extra_ref=f"\n  - {{pluginRef: latency-scorer, weight: {_w}}}")

# Precise prefix (issue 16): epp subscribed to the simulators' KV-cache events,
# tokenizing completions with the fleet's tokenizer. Its config needs the run's
# ports and tokenizer, so it is written when the contender starts. Naming it
# turns on real tokens and KV events in EVERY simulator of the run (the fleet
# must be the same for every contender): token blocks instead of the 4-byte
# rule, so figures of such a run compare with each other, not with other runs.
EPP_PRECISE_CONFIG = """\
plugins:
- type: token-producer
  parameters: {{local: {{path: {tokenizer}}}}}
- type: precise-prefix-cache-producer
  parameters:
    tokenProcessorConfig: {{blockSize: 16}}
    speculativeIndexing: true
    speculativeTTL: 5s
{indexer}    kvEventsConfig:
      podDiscoveryConfig: {{socketPort: {kv_base}}}
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
  parameters: {{prefixMatchInfoProducerName: precise-prefix-cache-producer}}
{extra_plugin}- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - {{pluginRef: queue-scorer, weight: 2}}
  - {{pluginRef: kv-cache-utilization-scorer, weight: 2}}
  - {{pluginRef: prefix-cache-scorer, weight: 3}}
{extra_ref}  - {{pluginRef: max-score-picker}}
"""

# epp-precise with the shared index in Redis (a redis-server the fleet starts; each run logs the
# first replica's shared-index counters). Replicas write their views, speculative blocks included,
# to the server and look requests up there, so several replicas see each other's picks before the
# engines report them.
EPP_PRECISE_REDIS_INDEXER = """\
    indexerConfig:
      kvBlockIndexConfig:
        redisConfig: {{address: "redis://127.0.0.1:{redis_port}"}}
"""

# Plugins and profile entries a precise contender adds to EPP_PRECISE_CONFIG. epp-precise-latency:
# the example profile's latency-scorer beside the default scorers (issues 15 and 16), its
# predictor reading the precise index's matches.
EPP_PRECISE_EXTRAS = {
    "epp-precise-latency": (
        "- type: predicted-latency-producer\n"
        "  parameters: {prefixMatchInfoProducerName: precise-prefix-cache-producer}\n"
        "- type: latency-scorer\n",
        "  - {pluginRef: latency-scorer, weight: 4}\n",
    ),
}

# Contenders whose simulators publish KV events and tokenize with the bench tokenizer.
PRECISE = ("epp-precise", "epp-precise-redis", "epp-precise-latency")

# Several replicas sharing what they dispatched and picked (issue 16): `epp-peers-x2`,
# `epp-precise-peers-x3`. Each replica's config gets the syncer, its own address and the
# list of all, as a user would write one config per replica or one headless Service name.
PEERS = "-peers"
# Every replica but the first on standby (Envoy's priority 1): see the module docs.
STANDBY = "-standby"
PEERS_SYNC = """\
- type: udp-peer-syncer
  parameters: {{address: "127.0.0.1:{own}"}}
- type: static-peer-discovery
  parameters: {{peers: [{peers}]}}
"""
PEERS_DATA_LAYER = """\
dataLayer:
  peerDiscovery: {pluginRef: static-peer-discovery}
  crossReplicaSyncerPluginRef: udp-peer-syncer
"""

KNOWN = CONTENDERS + list(EPP_VARIANTS) + list(PRECISE)


def epp_default_config() -> str:
    """epp's DEFAULT_CONFIG, read from its source so the file both pickers get
    cannot drift from what epp runs with no config."""
    src = (ROOT / "crates/epp-plugins/src/lib.rs").read_text()
    m = re.search(r'pub const DEFAULT_CONFIG: &str = "\\\n(.*?)";', src, re.S)
    if not m:
        raise RuntimeError("DEFAULT_CONFIG not found in crates/epp-plugins/src/lib.rs")
    return m.group(1)


LABELS = {
    "epp": "Envoy + epp (default config)",
    "epp-scraped-only": "Envoy + epp (default, countDispatched: false)",
    "epp-kv-scraped": "Envoy + epp (default, KV countDispatched: false)",
    "epp-lora": "Envoy + epp (default + lora-affinity-scorer ×2)",
    "epp-latency": "Envoy + epp (predicted-latency.yaml: the default profile + latency-scorer ×4)",
    "epp-latency-prefix1": "Envoy + epp (predicted-latency.yaml with prefix-cache-scorer ×1 instead of ×3)",
    "epp-latency-queue4": "Envoy + epp (predicted-latency.yaml with queue-scorer ×4 instead of ×2)",
    "epp-latency-active2": "Envoy + epp (predicted-latency.yaml, active-request-scorer ×2 for queue-scorer)",
    "epp-latency-active4": "Envoy + epp (predicted-latency.yaml, active-request-scorer ×4 for queue-scorer)",
    "epp-latency-running2": "Envoy + epp (predicted-latency.yaml + running-requests-size-scorer ×2)",
    "epp-latency-place1": "Envoy + epp (predicted-latency.yaml, placeDelayWeight 1)",
    "epp-latency-place2": "Envoy + epp (predicted-latency.yaml, placeDelayWeight 2)",
    "epp-latency-nodisplace": "Envoy + epp (predicted-latency.yaml, displacedCacheWeight 0)",
    "epp-latency-length": "Envoy + epp (predicted-latency.yaml, prefix scored by matched tokens: matchLengthWeight 1, scale 4,096)",
    "epp-latency-own": "Envoy + epp (predicted-latency.yaml, latency-scorer delayToOthersWeight 0)",
    "epp-latency-plus-active2": "Envoy + epp (predicted-latency.yaml + active-request-scorer ×2)",
    "epp-latency-alone": "Envoy + epp (latency-scorer alone)",
    "epp-latency-alone-own": "Envoy + epp (latency-scorer alone, delayToOthersWeight 0)",
    "epp-latency-own-length": "Envoy + epp (predicted-latency.yaml, delayToOthersWeight 0 and the prefix scored by matched tokens)",
    "epp-inflight-only": "Envoy + epp (active-request-scorer alone: join the shortest queue)",
    "epp-precise": "Envoy + epp (precise prefix: the engines' KV events + speculation 5 s, default weights)",
    "epp-precise-redis": "Envoy + epp (precise prefix as epp-precise, the index shared in Redis)",
    "epp-precise-latency": "Envoy + epp (precise prefix as epp-precise, with latency-scorer ×4 as in epp-latency)",
    "epp-peers": "Envoy + epp (default config, replicas sharing load and picks over udp-peer-syncer)",
    "epp-precise-peers": "Envoy + epp (precise prefix as epp-precise, replicas sharing load and picks)",
    "reference": "Envoy + reference picker (GIE v1.5.0, same config)",
    "round-robin": "Envoy round-robin",
    "sglang-cache-aware": "sglang-router cache_aware",
    "sglang-power-of-two": "sglang-router power_of_two",
    "vllm-cache-aware": "vllm-router cache_aware",
}

# Nothing may leave the machine: routers that load a tokenizer must find it
# locally, and a stray download goes to a dead proxy instead of hanging.
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HTTP_PROXY": "http://127.0.0.1:9",
    "HTTPS_PROXY": "http://127.0.0.1:9",
    "http_proxy": "http://127.0.0.1:9",
    "https_proxy": "http://127.0.0.1:9",
    "NO_PROXY": "127.0.0.1,localhost",
    "no_proxy": "127.0.0.1,localhost",
}


def log(msg: str) -> None:
    print(f"[{datetime.now().strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return 0, b""


def http_post(url: str, body: dict, timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()
    except OSError as e:
        return 0, {}, str(e).encode()


def wait_until(what: str, check, timeout: float = 60.0, proc: "Proc | None" = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if proc is not None and proc.popen.poll() is not None:
            raise RuntimeError(f"{what}: process exited ({proc.popen.returncode}); see {proc.log}")
        time.sleep(0.1)
    raise RuntimeError(f"{what}: not ready after {timeout:.0f}s" + (f"; see {proc.log}" if proc else ""))


class Proc:
    """A process this benchmark started, in its own process group, stopped on exit."""

    def __init__(self, name: str, cmd: list[str], log_path: Path, env: dict | None = None,
                 unset: tuple[str, ...] = ()):
        self.name = name
        self.log = log_path
        full_env = dict(os.environ)
        full_env.update(OFFLINE_ENV)
        if env:
            full_env.update(env)
        for k in unset:
            full_env.pop(k, None)
        self._file = open(log_path, "wb")
        self.popen = subprocess.Popen(
            cmd, stdout=self._file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=full_env, start_new_session=True,
        )

    def stop(self) -> None:
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGTERM)
                self.popen.wait(timeout=5)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.popen.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.popen.wait()
        self._file.close()


REFERENCE_SCRIPT = ROOT / "scripts/reference-epp.sh"
KUBE_ENV = ROOT / "scripts/kube-env.sh"
POOL_PORT_NOTE = "the pool's pods are the simulators, on 127.0.0.2, 127.0.0.3, ... and one shared port"


def script_out(script: Path, *args: str) -> str:
    return subprocess.run(["bash", str(script), *args], capture_output=True, text=True,
                          check=True).stdout.strip()


def reference_missing() -> list[str]:
    """What the reference contender needs and is not built or present."""
    missing = []
    ref = Path(script_out(REFERENCE_SCRIPT, "path"))
    if not ref.exists():
        missing.append(f"{ref} (scripts/reference-epp.sh build)")
    kube = Path(script_out(KUBE_ENV, "bin-dir"))
    for b in ("etcd", "kube-apiserver"):
        if not (kube / b).exists():
            missing.append(f"{kube / b} (scripts/kube-env.sh build)")
    crds = Path(os.environ.get("EPP_KUBE_CRDS", ROOT.parent / "shared/reference/crds"))
    if not list(crds.glob("*.yaml")):
        missing.append(f"the InferencePool CRDs in {crds} (shared/ next to the checkout, or EPP_KUBE_CRDS)")
    return missing


class KubeEnv:
    """The test control plane (scripts/kube-env.sh): one per benchmark run, a fresh
    namespace per fleet. Objects are created through its API with the admin token."""

    def __init__(self, out: Path):
        self.dir = out / "kube"
        log(f"starting the test control plane in {self.dir}")
        # Passing our pid: the control plane goes when this run does, even if killed.
        out_text = subprocess.run(
            ["bash", str(KUBE_ENV), "start", str(self.dir)], capture_output=True, text=True,
            env={**os.environ, "EPP_KUBE_OWNER_PID": str(os.getpid())},
        )
        if out_text.returncode != 0:
            self.stop()  # what it started before failing
            raise RuntimeError(f"scripts/kube-env.sh start failed:\n{out_text.stderr[-2000:]}")
        self.kubeconfig = Path(out_text.stdout.strip().splitlines()[-1])
        self.server = (self.dir / "server").read_text().strip()
        self.token = (self.dir / "admin.token").read_text().strip()
        self.ssl = ssl.create_default_context(cafile=str(self.dir / "pki/ca.crt"))
        self.count = 0

    def stop(self) -> None:
        subprocess.run(["bash", str(KUBE_ENV), "stop", str(self.dir)], check=False)

    def api(self, method: str, path: str, body: dict, content_type: str = "application/json") -> dict:
        req = urllib.request.Request(
            self.server + path, data=json.dumps(body).encode(), method=method,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": content_type},
        )
        try:
            with urllib.request.urlopen(req, timeout=30, context=self.ssl) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"{method} {path}: HTTP {e.code}: {e.read()[:500]!r}") from None

    def pool(self, ips: list[str], port: int) -> str:
        """A fresh namespace holding InferencePool `pool` over Ready pods with `ips`."""
        self.count += 1
        ns = f"bench-{self.count}"
        self.api("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                 "metadata": {"name": ns}})
        self.api("POST", f"/apis/inference.networking.k8s.io/v1/namespaces/{ns}/inferencepools", {
            "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
            "metadata": {"name": "pool"},
            "spec": {"selector": {"matchLabels": {"app": "model"}}, "targetPorts": [{"number": port}],
                     "endpointPickerRef": {"name": "epp", "port": {"number": 9002}}},
        })
        for i, ip in enumerate(ips):
            name = f"sim-{i}"
            self.api("POST", f"/api/v1/namespaces/{ns}/pods", {
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": "model"}},
                "spec": {"containers": [{"name": "model", "image": "vllm"}]},
            })
            # No kubelet: the status is set through the status subresource.
            self.api("PATCH", f"/api/v1/namespaces/{ns}/pods/{name}/status", {"status": {
                "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                "conditions": [{"type": "Ready", "status": "True"}],
            }}, content_type="application/merge-patch+json")
        return ns


def shared_loopback_port(ips: list[str]) -> int:
    """A port free on every address in `ips`."""
    for _ in range(50):
        port = free_port()
        try:
            for ip in ips:
                with socket.socket() as s:
                    s.bind((ip, port))
            return port
        except OSError:
            continue
    raise RuntimeError(f"no port free on all of {ips}")


def epp_replicas(contender: str) -> tuple[str, int]:
    """`epp-x2` -> ("epp", 2): an epp contender run as N replicas behind one Envoy.
    `-peers` and `-standby` suffixes before it (`epp-precise-peers-standby-x2`) are dropped
    here: see `shares_state` and `STANDBY`."""
    m = re.fullmatch(r"(.+)-x([2-9])", contender)
    base, n = (m.group(1), int(m.group(2))) if m else (contender, 1)
    return base.removesuffix(STANDBY).removesuffix(PEERS), n


def shares_state(contender: str) -> bool:
    """`epp-peers-x2`: the replicas tell each other their in-flight load and picks
    (`udp-peer-syncer` with `static-peer-discovery` listing every replica)."""
    return PEERS in contender


def consecutive_free_ports(n: int) -> int:
    """A port p with p .. p+n-1 all free on 127.0.0.1."""
    for _ in range(50):
        base = free_port()
        try:
            for p in range(base, base + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
    raise RuntimeError(f"no {n} consecutive free ports")


class Fleet:
    """N simulators plus one contender in front of them."""

    def __init__(self, args: argparse.Namespace, workload: Workload, contender: str, run_dir: Path):
        self.args = args
        self.dir = run_dir
        self.procs: list[Proc] = []
        self.sim_ports: list[int] = []
        self.sim_hosts: list[str] = []
        # Each epp replica's metrics port (none for other contenders).
        self.epp_metrics_ports: list[int] = []
        try:
            # The reference finds its endpoints only as pods, by IP with the pool's one target
            # port: its simulators listen on distinct loopback addresses and one shared port.
            self._start_sims(workload, pods=contender == "reference")
            self.url = self._start_contender(contender)
        except BaseException:
            self.stop()
            raise

    @property
    def epp_metrics_port(self) -> int | None:
        """The first epp replica's metrics port."""
        return self.epp_metrics_ports[0] if self.epp_metrics_ports else None

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.stop()
        self.procs.clear()

    def _spawn(self, name: str, cmd: list[str], env: dict | None = None, unset: tuple[str, ...] = ()) -> Proc:
        p = Proc(name, cmd, self.dir / f"{name}.log", env, unset)
        self.procs.append(p)
        return p

    def _start_sims(self, workload: Workload, pods: bool) -> None:
        if self.args.fleet == "llm-d-sim":
            self._start_llmd_sims(workload.sims)
            return
        hosts = [f"127.0.0.{i + 2}" if pods else "127.0.0.1" for i in range(workload.sims)]
        shared = shared_loopback_port(hosts) if pods else None
        ports = [shared or free_port() for _ in hosts]
        # With KV events, epp subscribes to <ip>:<base + rank>, the rank being
        # a simulator's position among those sharing its IP, by port.
        self.kv_base = consecutive_free_ports(workload.sims) if self.args.kv_events else 0
        for i, host in enumerate(hosts):
            port = ports[i]
            events = []
            if self.args.kv_events:
                rank = sorted(p for h, p in zip(hosts, ports) if h == host).index(port)
                events = ["--tokenizer", str(self.args.tokenizer), "--kv-events-config", json.dumps({
                    "enable_kv_cache_events": True, "publisher": "zmq",
                    "endpoint": f"tcp://{host}:{self.kv_base + rank}",
                    "topic": f"kv@{host}:{port}@{MODEL}"})]
            p = self._spawn(
                f"sim-{i}",
                [str(self.args.bin_dir / "epp-sim"), "--host", host, "--port", str(port),
                 "--pod-name", f"sim-{i}", "--model", MODEL, "--model-path", str(self.args.tokenizer)]
                + sim_args_at(workload.speeds[i] if workload.speeds else 1.0) + workload.sim_args + events,
            )
            self.sim_ports.append(port)
            self.sim_hosts.append(host)
            wait_until(f"sim-{i}", lambda: http_get(f"http://{host}:{port}/health")[0] == 200,
                       proc=p)

    def _start_llmd_sims(self, n: int) -> None:
        for i in range(n):
            port = free_port()
            # Its KV cache model wants the pod's IP (it names the KV-event topic after it).
            p = self._spawn(f"sim-{i}", [str(self.args.llmd_sim_bin), "--port", str(port),
                                         "--model", MODEL] + LLMD_SIM_ARGS,
                            env={"POD_IP": "127.0.0.1"})
            self.sim_ports.append(port)
            self.sim_hosts.append("127.0.0.1")
            wait_until(f"sim-{i}", lambda: http_get(f"http://127.0.0.1:{port}/health")[0] == 200,
                       proc=p)

    def _start_contender(self, contender: str) -> str:
        port = free_port()
        urls = [f"http://127.0.0.1:{p}" for p in self.sim_ports]
        base, replicas = epp_replicas(contender)
        if base == "epp" or base in EPP_VARIANTS or base in PRECISE:
            # The default contender gets the same file as the reference: epp's DEFAULT_CONFIG.
            if base in PRECISE:
                indexer = ""
                if base == "epp-precise-redis":
                    redis_port = free_port()
                    p = self._spawn("redis", ["redis-server", "--port", str(redis_port), "--bind",
                                              "127.0.0.1", "--save", "", "--appendonly", "no"])
                    wait_until("redis", lambda: "Ready to accept connections"
                               in p.log.read_text(errors="replace"), proc=p)
                    indexer = EPP_PRECISE_REDIS_INDEXER.format(redis_port=redis_port)
                extra_plugin, extra_ref = EPP_PRECISE_EXTRAS.get(base, ("", ""))
                text = EPP_PRECISE_CONFIG.format(
                    tokenizer=self.args.tokenizer, kv_base=self.kv_base, indexer=indexer,
                    extra_plugin=extra_plugin, extra_ref=extra_ref)
            else:
                text = EPP_VARIANTS.get(base) or epp_default_config()
            (self.dir / "epp-config.yaml").write_text(text)
            config = ["--config-file", str(self.dir / "epp-config.yaml")]
            sync_ports = [free_udp_port() for _ in range(replicas)] if shares_state(contender) else []
            kept = os.environ.get("EPP_BENCH_DECISIONS")
            decisions = (["--decision-log-size", kept, "--decision-log-interval", "0"]
                         if kept else [])
            # Several replicas: Envoy's ext_proc cluster round-robins over them,
            # as a user running two or three epp replicas for availability does.
            grpcs = []
            for r in range(replicas):
                if sync_ports:
                    peers = ", ".join(f'"127.0.0.1:{p}"' for p in sync_ports)
                    own = PEERS_SYNC.format(own=sync_ports[r], peers=peers)
                    if not text.startswith("plugins:\n") and "\nplugins:\n" not in text:
                        raise RuntimeError("epp config without a plugins: list")
                    mine = text.replace("plugins:\n", "plugins:\n" + own, 1) + PEERS_DATA_LAYER
                    (self.dir / f"epp-config-{r}.yaml").write_text(mine)
                    config = ["--config-file", str(self.dir / f"epp-config-{r}.yaml")]
                grpc = free_port()
                grpcs.append(grpc)
                metrics = free_port()
                self.epp_metrics_ports.append(metrics)
                name = "epp" if r == 0 else f"epp-{r}"
                p = self._spawn(name, [
                    str(self.args.bin_dir / "epp"), "--grpc-port", str(grpc), "--grpc-health-port",
                    str(free_port()), "--metrics-port", str(metrics), "--bind-address", "127.0.0.1",
                    "--secure-serving=false", "--drain-timeout", "0s", "--endpoints",
                    ",".join(f"127.0.0.1:{p}" for p in self.sim_ports), *config, *decisions,
                ], env={"RUST_LOG": os.environ.get("EPP_BENCH_RUST_LOG", "warn")})
                wait_until(name, lambda: "epp listening" in p.log.read_text(errors="replace"), proc=p)
            config = (ROOT / "examples/envoy/envoy-streamed.yaml").read_text()
            one = "              socket_address: { address: 127.0.0.1, port_value: 9002 }\n"
            if one not in config:
                raise RuntimeError("examples/envoy/envoy-streamed.yaml: ext_proc endpoint line not found")
            # On standby, the other replicas are a second locality at priority 1: Envoy
            # sends them nothing while the first is healthy.
            later = ("      - priority: 1\n        lb_endpoints:\n" if STANDBY in contender else "") \
                + "        - endpoint:\n            address:\n"
            endpoints = "".join(
                (later if i else "") + one.replace("9002", str(g)) for i, g in enumerate(grpcs))
            config = config.replace(one, endpoints)
            return self._start_envoy(config, port)
        if contender == "reference":
            return self._start_reference(port)
        if contender == "round-robin":
            template = (ROOT / "examples/envoy/envoy-round-robin.yaml").read_text()
            begin = template.index("        # ENDPOINTS-BEGIN")
            end = template.index("        # ENDPOINTS-END")
            endpoints = "".join(
                "        - endpoint: { address: { socket_address: { address: 127.0.0.1, "
                f"port_value: {p} }} }} }}\n"
                for p in self.sim_ports
            )
            return self._start_envoy(template[:begin] + endpoints + template[end:], port)
        if contender.startswith("sglang-"):
            policy = {"sglang-cache-aware": "cache_aware", "sglang-power-of-two": "power_of_two"}[contender]
            p = self._spawn("sglang-router", [
                str(VENV / "bin/python"), "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
                "--port", str(port), "--prometheus-port", str(free_port()), "--policy", policy,
                "--log-level", "warn", "--worker-urls", *urls,
            ])
            wait_until("sglang-router", lambda: http_get(f"http://127.0.0.1:{port}/readiness")[0] == 200,
                       proc=p)
            return f"http://127.0.0.1:{port}"
        if contender == "vllm-cache-aware":
            p = self._spawn("vllm-router", [
                str(VENV / "bin/vllm-router"), "--host", "127.0.0.1", "--port", str(port),
                "--prometheus-port", str(free_port()), "--policy", "cache_aware",
                "--log-level", "warning", "--worker-urls", *urls,
            ])
            wait_until("vllm-router", lambda: http_get(f"http://127.0.0.1:{port}/readiness")[0] == 200,
                       proc=p)
            return f"http://127.0.0.1:{port}"
        raise ValueError(f"unknown contender {contender!r}; known: {', '.join(KNOWN)}")

    def _start_reference(self, port: int) -> str:
        kube: KubeEnv = self.args.kube
        ns = kube.pool(self.sim_hosts, self.sim_ports[0])
        config = self.dir / "epp-config.yaml"
        config.write_text(epp_default_config())
        grpc = free_port()
        # As a user runs it, with the flags that take out TLS, tracing, pprof and metrics auth
        # (none of which a loopback benchmark has); then --reference-args.
        p = self._spawn("reference-epp", [
            str(self.args.reference_bin), "--pool-name", "pool", "--pool-namespace", ns,
            "--grpc-port", str(grpc), "--grpc-health-port", str(free_port()),
            "--metrics-port", str(free_port()), "--config-file", str(config),
            "--secure-serving=false", "--tracing=false", "--enable-pprof=false",
            "--metrics-endpoint-auth=false", *self.args.reference_args.split(),
        ], env={"KUBECONFIG": str(kube.kubeconfig)}, unset=("KUBERNETES_SERVICE_HOST",))
        wait_until("reference epp", lambda: "Controller manager starting" in p.log.read_text(errors="replace"),
                   proc=p)
        envoy_config = (ROOT / "examples/envoy/envoy-streamed.yaml").read_text()
        url = self._start_envoy(envoy_config.replace("port_value: 9002", f"port_value: {grpc}"), port)

        # It routes once its first pod sync has seen the pool's pods.
        def routes() -> bool:
            return http_post(f"{url}/v1/completions", {"model": MODEL, "prompt": "ready?", "max_tokens": 1},
                             timeout=5)[0] == 200
        wait_until("reference epp routing through Envoy", routes, timeout=60, proc=p)
        return url

    def _start_envoy(self, config: str, port: int) -> str:
        admin = free_port()
        config = config.replace("port_value: 9901", f"port_value: {admin}")
        config = config.replace("port_value: 10000", f"port_value: {port}")
        path = self.dir / "envoy.yaml"
        path.write_text(config)
        envoy = VENV / "envoy"
        if not envoy.exists():
            raise RuntimeError(f"Envoy missing at {envoy}: run scripts/setup.sh --no-build")
        p = self._spawn("envoy", [
            str(envoy), "-c", str(path), "--concurrency", "1", "--disable-hot-restart",
            "-l", "warning", "--base-id", str(port),
        ])
        wait_until("envoy", lambda: http_get(f"http://127.0.0.1:{admin}/ready")[0] == 200, proc=p)
        return f"http://127.0.0.1:{port}"

    def sim_counters(self) -> list[dict[str, float]]:
        """Per simulator: the counters this benchmark reads from /metrics."""
        out = []
        for host, port in zip(self.sim_hosts, self.sim_ports):
            status, body = http_get(f"http://{host}:{port}/metrics")
            values: dict[str, float] = {}
            if status == 200:
                for line in body.decode(errors="replace").splitlines():
                    m = METRIC_LINE.match(line)
                    name = m and COUNTER_ALIASES.get(m.group(1), m.group(1))
                    if name in COUNTERS:
                        values[name] = values.get(name, 0.0) + float(m.group(2))
            out.append({c: values.get(c, 0.0) for c in COUNTERS})
        return out


COUNTERS = {
    "vllm:prefix_cache_hits_total",
    "vllm:prefix_cache_queries_total",
    "vllm:request_success_total",
    "vllm:generation_tokens_total",
}
# llm-d-inference-sim names two of them without the `_total` suffix.
COUNTER_ALIASES = {
    "vllm:prefix_cache_hits": "vllm:prefix_cache_hits_total",
    "vllm:prefix_cache_queries": "vllm:prefix_cache_queries_total",
}
METRIC_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})?\s+(\S+)")


class SideLoad(threading.Thread):
    """Unique prompts sent straight to every simulator at a fixed rate (a
    workload's `side_load`), each in its own thread so that slow answers do not
    slow the rate. Counts what was sent and what failed."""

    def __init__(self, fleet: "Fleet", rate: float, tokens: int):
        super().__init__(daemon=True)
        self.urls = [f"http://{h}:{p}/v1/completions" for h, p in zip(fleet.sim_hosts, fleet.sim_ports)]
        self.interval = 1.0 / rate
        self.tokens = tokens
        self.done = threading.Event()
        self.sent_at: list[float] = []
        self.failed = 0
        self.lock = threading.Lock()
        self.rng = random.Random(7)

    def prompt(self) -> str:
        # Words of the bench tokenizer's vocabulary, which it and the simulators'
        # 4-byte rule both count as one token each; the leading id shares no
        # block with a tenant's prompt.
        words = [f"{self.rng.getrandbits(40):010x}"]
        words += self.rng.choices(SIDE_WORDS, k=self.tokens - 3)
        return " ".join(words)

    def send(self, url: str, prompt: str) -> None:
        with self.lock:
            self.sent_at.append(time.time())
        status, _, _ = http_post(url, {"model": MODEL, "prompt": prompt, "max_tokens": 1}, timeout=60.0)
        with self.lock:
            self.failed += status != 200

    def queries(self, start: float, end: float) -> float:
        """Prompt tokens it sent between `start` and `end` (all misses: each
        prompt is unique), to take out of the simulators' prefix-cache queries."""
        with self.lock:
            return sum(start <= t < end for t in self.sent_at) * float(self.tokens)

    def run(self) -> None:
        # Spread the simulators' sends over the interval.
        step = self.interval / len(self.urls)
        next_at = time.monotonic()
        i = 0
        while not self.done.is_set():
            threading.Thread(target=self.send, args=(self.urls[i % len(self.urls)], self.prompt()),
                             daemon=True).start()
            i += 1
            next_at += step
            self.done.wait(max(0.0, next_at - time.monotonic()))


# The bench tokenizer's words, drawn as benches/routing/make_tokenizer.py draws them.
TOKENIZER_WORDS = random.Random(7).sample(
    ["".join(t) for t in itertools.product("abcdefghijklmnopqrstuvwxyz", repeat=3)], 8000)
SIDE_WORDS = TOKENIZER_WORDS[:256]


class Poller(threading.Thread):
    """Samples the simulators' counters every 0.5 s with a wall-clock stamp."""

    def __init__(self, fleet: Fleet):
        super().__init__(daemon=True)
        self.fleet = fleet
        self.samples: list[tuple[float, list[dict[str, float]]]] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.samples.append((time.time(), self.fleet.sim_counters()))
            self.done.wait(0.5)
        self.samples.append((time.time(), self.fleet.sim_counters()))

    def window(self, start: float, end: float) -> list[dict[str, float]]:
        """Per-simulator counter increase between the samples nearest `start` and `end`."""
        def nearest(t: float):
            return min(self.samples, key=lambda s: abs(s[0] - t))[1]
        a, b = nearest(start), nearest(end)
        return [{k: bv.get(k, 0.0) - av.get(k, 0.0) for k in COUNTERS} for av, bv in zip(a, b)]


def check_routing(fleet: Fleet, workload: Workload) -> dict:
    """Sends distinct short requests through the contender; every one must
    succeed and reach a simulator, and together they must reach more than one."""
    before = fleet.sim_counters()
    pods = {}
    for i in range(16):
        model = ADAPTERS[i % len(ADAPTERS)] if workload.lora else MODEL
        status, headers, body = http_post(f"{fleet.url}/v1/completions", {
            "model": model, "prompt": f"routing check {i}: " + "word " * (8 + 37 * i), "max_tokens": 2,
        })
        if status != 200:
            raise RuntimeError(f"routing check: {fleet.url} answered {status}: {body[:300]!r}")
        pod = {k.lower(): v for k, v in headers.items()}.get("x-inference-pod", "?")
        pods[pod] = pods.get(pod, 0) + 1
    after = fleet.sim_counters()
    served = [a.get("vllm:request_success_total", 0) - b.get("vllm:request_success_total", 0)
              for a, b in zip(after, before)]
    if sum(served) < 16:
        raise RuntimeError(f"routing check: simulators counted {served} of 16 requests")
    return {"pods": pods, "servers_used": sum(1 for s in served if s > 0)}


def inference_perf_config(args, workload: Workload, url: str, out: Path, rates: list[float]) -> dict:
    cfg = {
        "api": {"type": "completion", "streaming": True},
        "server": {"type": "vllm", "model_name": MODEL, "base_url": url, "ignore_eos": True},
        "tokenizer": {"pretrained_model_name_or_path": str(args.tokenizer)},
        "data": workload.data,
        "load": {
            "type": "poisson",
            "interval": 2,
            # Stage 0 warms the caches (every tenant seen at least once) and is not reported.
            "stages": [{"rate": WARMUP_RATE, "duration": WARMUP_SECS}]
            + [{"rate": r, "duration": workload.stage_secs if not args.quick else 6} for r in rates],
            "num_workers": 2,
            "worker_max_concurrency": 200,
            "request_timeout": 30,
            "stage_teardown_grace_seconds": 30,
            "base_seed": 12345,
        },
        "report": {"request_lifecycle": {"summary": True, "per_stage": True, "per_request": False}},
        "storage": {"local_storage": {"path": str(out)}},
    }
    if workload.lora:
        # 8 adapters: 1/8 is exact in binary, so the splits sum to exactly 1.0.
        cfg["load"]["lora_traffic_split"] = [{"name": a, "split": 1 / len(ADAPTERS)} for a in ADAPTERS]
    return cfg


def parse_stage_time(text: str, key: str) -> float:
    m = re.search(rf"^\s+{key}: '([^']+)'", text, re.M)
    if not m:
        raise RuntimeError(f"no {key} time in inference-perf stage report")
    return datetime.fromisoformat(m.group(1).replace("Z", "+00:00")).timestamp()


def run_one(args, workload: Workload, contender: str, repeat: int, results) -> None:
    run_dir = args.out / "runs" / f"{workload.name}-{contender}-{repeat}"
    run_dir.mkdir(parents=True, exist_ok=True)
    log(f"{workload.name} / {contender} / run {repeat}: starting fleet")
    fleet = Fleet(args, workload, contender, run_dir)
    side = None
    try:
        check = check_routing(fleet, workload)
        log(f"  routing check ok: {check['pods']}")
        poller = Poller(fleet)
        poller.start()
        if workload.side_load:
            side = SideLoad(fleet, *workload.side_load)
            side.start()
        rates = workload.rates if not args.quick or args.rates else workload.rates[:2]
        client = args.client or workload.client
        if client == "rust":
            stages = run_rust_client(args, workload, fleet, run_dir, rates)
            poller.done.set()
            poller.join()
            for i, rate in enumerate(rates, start=1):
                st = stages[i]
                end = stages[i + 1]["start"] if i < len(rates) else poller.samples[-1][0]
                r = record_rust(workload, contender, repeat, rate, st, poller.window(st["start"], end), check,
                                side.queries(st["start"], end) if side else 0.0)
                results.write(json.dumps(r) + "\n")
                results.flush()
                log_point(r)
            return
        ip_out = run_dir / "inference-perf"
        cfg_path = run_dir / "inference-perf.yaml"
        cfg_path.write_text(json.dumps(inference_perf_config(args, workload, fleet.url, ip_out, rates), indent=2))
        ip = Proc("inference-perf", [str(args.inference_perf), "--config_file", str(cfg_path)],
                  run_dir / "inference-perf.log")
        try:
            ip.popen.wait(timeout=60 + WARMUP_SECS + len(rates) * (workload.stage_secs + 40))
        except subprocess.TimeoutExpired:
            log("  inference-perf timed out; stopping it")
        ip.stop()
        poller.done.set()
        poller.join()
        if ip.popen.returncode != 0:
            raise RuntimeError(f"inference-perf exited {ip.popen.returncode}; see {ip.log}")
        for i, rate in enumerate(rates, start=1):
            stage = json.loads((ip_out / f"stage_{i}_lifecycle_metrics.json").read_text())
            times = (ip_out / f"inference-perf.partial.stage_{i}.yaml").read_text()
            start = parse_stage_time(times, "start")
            # Requests still in flight at the stage's end finish during its teardown: count the
            # simulators' work up to the next stage's start.
            if i < len(rates):
                end = parse_stage_time((ip_out / f"inference-perf.partial.stage_{i + 1}.yaml").read_text(), "start")
            else:
                end = poller.samples[-1][0]
            sims = poller.window(start, end)
            r = record(workload, contender, repeat, rate, stage, sims, check,
                       side.queries(start, end) if side else 0.0)
            results.write(json.dumps(r) + "\n")
            results.flush()
            log_point(r)
    finally:
        if side is not None:
            side.done.set()
            side.join()
            log(f"  side load: {len(side.sent_at)} requests straight to the simulators, {side.failed} failed")
        record_predictions(args, fleet, workload, contender, repeat)
        if os.environ.get("EPP_BENCH_DECISIONS"):
            save_decisions(fleet)
        if epp_replicas(contender)[0] == "epp-precise-redis":
            log_shared_index(fleet)
        fleet.stop()


def save_decisions(fleet) -> None:
    """Each epp replica's kept decisions (EPP_BENCH_DECISIONS) into the run's
    directory, as its decision view serves them."""
    for r, port in enumerate(fleet.epp_metrics_ports):
        status, body = http_get(f"http://127.0.0.1:{port}/debug/decisions.json", timeout=10.0)
        if status != 200:
            log(f"  decisions of replica {r}: status {status}")
            continue
        (fleet.dir / f"decisions-{r}.json").write_bytes(body)


def log_shared_index(fleet) -> None:
    """How the first replica's lookups in the shared index went: a lookup the
    server did not answer in time fell back to the replica's own view."""
    port = fleet.epp_metrics_port
    status, body = http_get(f"http://127.0.0.1:{port}/metrics") if port else (0, b"")
    counts = {}
    for line in body.decode(errors="replace").splitlines():
        m = METRIC_LINE.match(line)
        if m and m.group(1).startswith("epp_kv_block_index_shared_"):
            counts[m.group(1)] = counts.get(m.group(1), 0.0) + float(m.group(2))
    log(f"  shared index (first replica): {counts or f'no metrics (status {status})'}")


def record_predictions(args, fleet, workload: Workload, contender: str, repeat: int) -> None:
    """For a contender whose epp learns latencies: the median relative error
    of its TTFT predictions over the run (every sample predicted before it
    was learned, by the endpoint's own model once warm), from epp's
    epp_latency_prediction_relative_error histogram, to predictions.jsonl."""
    port = fleet.epp_metrics_port
    if port is None:
        return
    try:
        status, body = http_get(f"http://127.0.0.1:{port}/metrics")
    except Exception as e:  # a run's figures must not be lost over this one
        log(f"  prediction error: cannot read epp's metrics: {e}")
        return
    if status != 200:
        return
    buckets: dict[float, float] = defaultdict(float)
    for line in body.decode(errors="replace").splitlines():
        m = re.match(r'epp_latency_prediction_relative_error_bucket\{(.*)\} (\S+)$', line)
        if not m or 'latency="ttft"' not in m.group(1) or 'endpoint="fleet"' in m.group(1):
            continue
        le = re.search(r'le="([^"]+)"', m.group(1)).group(1)
        buckets[float("inf") if le == "+Inf" else float(le)] += float(m.group(2))
    if not buckets:
        return
    bounds = sorted(buckets)
    total = buckets[bounds[-1]]
    if total == 0:
        return
    # The median by linear interpolation within its (cumulative) bucket.
    median, lower, below = None, 0.0, 0.0
    for b in bounds:
        if buckets[b] >= total / 2:
            upper = b if b != float("inf") else lower * 2 or 1.0
            share = (total / 2 - below) / (buckets[b] - below) if buckets[b] > below else 0.0
            median = lower + share * (upper - lower)
            break
        lower, below = b, buckets[b]
    within = buckets.get(0.25, 0.0) / total
    r = {"workload": workload.name, "contender": contender, "repeat": repeat, "samples": int(total),
         "ttft_median_rel_error": median, "ttft_within_25pct": within}
    with open(args.out / "predictions.jsonl", "a") as f:
        f.write(json.dumps(r) + "\n")
    log(f"  TTFT prediction: median relative error {median:.3f}, {within:.0%} within 25 % "
        f"({int(total)} samples)")


def log_point(r: dict) -> None:
    p90 = r["ttft_p90_ms"]
    hit = r["hit_rate"]
    log(f"  {r['rate']:>5} req/s: TTFT p90 {p90 if p90 is not None else float('nan'):.0f} ms, "
        f"hit rate {hit if hit is not None else float('nan'):.3f}, ok {r['ok']}, errors {r['errors']}, "
        f"sent at {r['offered_rate'] or 0:.1f} req/s ({r['client']})")


def rust_client_path() -> Path:
    """Builds (if needed) the Rust load generator and returns its executable."""
    out = subprocess.run(
        ["cargo", "bench", "--no-run", "--message-format=json", "-q", "-p", "epp-bin", "--bench", "routing"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout
    for line in out.splitlines():
        msg = json.loads(line)
        if msg.get("reason") == "compiler-artifact" and msg.get("target", {}).get("name") == "routing" \
                and msg.get("executable"):
            return Path(msg["executable"])
    raise RuntimeError("cargo did not report the routing bench executable")


def run_rust_client(args, workload: Workload, fleet: "Fleet", run_dir: Path, rates: list[float]) -> dict[int, dict]:
    url = fleet.url
    out = run_dir / "rust-client.jsonl"
    secs = workload.stage_secs if not args.quick else 6
    words = []
    if args.kv_events:
        # The fleet tokenizes with the bench tokenizer: prompts of its words
        # are one token a word, as the 4-byte rule counts them elsewhere.
        (run_dir / "words.txt").write_text("\n".join(TOKENIZER_WORDS) + "\n")
        words = ["--words", str(run_dir / "words.txt")]
    side = []
    if workload.side_gateway:
        side = ["--side", ",".join(f"{h}:{p}" for h, p in zip(fleet.sim_hosts, fleet.sim_ports)),
                "--side-rate", f"{workload.side_gateway:g}"]
    p = Proc("rust-client", [
        str(args.rust_client), "--url", url, "--workload", workload.shape or workload.name,
        "--rates", ",".join(f"{r:g}" for r in rates), "--secs", str(secs),
        "--warmup-rate", str(WARMUP_RATE), "--warmup-secs", str(WARMUP_SECS), "--seed", "1",
        "--timeout", "30", "--out", str(out), "--requests-out", str(run_dir / "requests.jsonl"), *words,
        *side, *(["--usage"] if args.usage else []),
    ], run_dir / "rust-client.log")
    try:
        p.popen.wait(timeout=60 + WARMUP_SECS + len(rates) * (secs + 40))
    except subprocess.TimeoutExpired:
        log("  rust client timed out; stopping it")
    p.stop()
    if p.popen.returncode != 0:
        raise RuntimeError(f"rust client exited {p.popen.returncode}; see {p.log}")
    stages = {s["stage"]: s for s in map(json.loads, out.read_text().splitlines())}
    if len(stages) != len(rates) + 1:
        raise RuntimeError(f"rust client wrote {len(stages)} stages, expected {len(rates) + 1}")
    return stages


def sims_fields(sims: list[dict], side_queries: float = 0.0) -> dict:
    """The fleet's prefix-cache hit rate over the router's traffic (a side
    load's prompt tokens, all misses, taken out) and the requests each served."""
    hits = sum(s["vllm:prefix_cache_hits_total"] for s in sims)
    queries = max(hits, sum(s["vllm:prefix_cache_queries_total"] for s in sims) - side_queries)
    return {
        "hit_rate": hits / queries if queries else None,
        "served_per_sim": [s["vllm:request_success_total"] for s in sims],
    }


def record_rust(workload, contender, repeat, rate, st, sims, check, side_queries=0.0) -> dict:
    return {
        "workload": workload.name,
        "contender": contender,
        "repeat": repeat,
        "rate": rate,
        "client": "rust",
        "achieved_rate": st["requests_per_s"],
        "offered_rate": st["sent_rate"],
        "ok": st["ok"],
        "errors": st["errors"],
        **{k: st[k] for k in ["ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p90_ms",
                              "output_tokens_per_s"]},
        **sims_fields(sims, side_queries),
        # With a side gateway the simulators' counters mix both streams; the client's own count
        # (the servers' cached tokens in each answer's usage) is the router's alone.
        **({"hit_rate": st["hit_rate"], "side_sent": st["side_sent"]} if st.get("side_sent") is not None else {}),
        "routing_check": check,
    }


def record(workload, contender, repeat, rate, stage, sims, check, side_queries=0.0) -> dict:
    ok = stage.get("successes", {})
    lat = ok.get("latency", {})

    def pct(metric: str, p: str) -> float | None:
        v = lat.get(metric, {}).get(p)
        return None if v is None else v * 1000.0

    return {
        "workload": workload.name,
        "contender": contender,
        "repeat": repeat,
        "rate": rate,
        "client": "inference-perf",
        "achieved_rate": ok.get("throughput", {}).get("requests_per_sec") or 0.0,
        "offered_rate": stage.get("load_summary", {}).get("achieved_rate"),
        "ok": ok.get("count", 0),
        "errors": stage.get("failures", {}).get("count", 0),
        "ttft_p50_ms": pct("time_to_first_token", "median"),
        "ttft_p90_ms": pct("time_to_first_token", "p90"),
        "ttft_p99_ms": pct("time_to_first_token", "p99"),
        "tpot_p50_ms": pct("time_per_output_token", "median"),
        "tpot_p90_ms": pct("time_per_output_token", "p90"),
        "output_tokens_per_s": ok.get("throughput", {}).get("output_tokens_per_sec"),
        **sims_fields(sims, side_queries),
        "routing_check": check,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "target/routing-bench" / datetime.now().strftime("%Y%m%d-%H%M%S"))
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--contenders", help=f"comma-separated, default {','.join(CONTENDERS)}; "
                    f"also {','.join(EPP_VARIANTS)}")
    ap.add_argument("--reference-args", default="",
                    help="extra flags for the reference picker, e.g. '--v=1' (default: none)")
    ap.add_argument("--fleet", choices=FLEETS, default="epp-sim",
                    help="the simulators: epp-sim (default), or llm-d's llm-d-inference-sim, built from its Go "
                         "module by scripts/reference-epp.sh build-sim (cached outside the checkout)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="two rates, 6 s stages, one run: a smoke test")
    ap.add_argument("--rates", help="comma-separated request rates for every workload chosen, instead of "
                    "each workload's sweep (with --quick too)")
    ap.add_argument("--stage-secs", type=int,
                    help="every rate's stage this long instead of the workload's own (10 s for most): more "
                    "requests per stage, so a tail set by a few bursts in 10 s is measured over many")
    ap.add_argument("--bin-dir", type=Path, default=ROOT / "target/release")
    ap.add_argument("--tokenizer", type=Path, default=VENV / "bench-tokenizer")
    ap.add_argument("--inference-perf", type=Path, default=VENV / "py312/bin/inference-perf")
    ap.add_argument("--client", choices=["inference-perf", "rust"],
                    help="one client for every workload (default: inference-perf, Rust for the LoRA mix and "
                    "two-gateways); Rust has every workload and sends every contender the same arrivals "
                    "(two-gateways is Rust only: it sends the second gateway's stream)")
    ap.add_argument("--usage", action="store_true",
                    help="the Rust client asks every answer for its usage, so each run's requests.jsonl says "
                    "how many of a request's prompt tokens its server had cached (always with two-gateways)")
    args = ap.parse_args()
    if args.usage and args.client != "rust":
        ap.error("--usage needs --client rust")
    if args.quick:
        args.repeats = 1
    known = {**WORKLOADS, **EXTRA_WORKLOADS}
    unknown = [w for w in args.workloads.split(",") if w not in known]
    if unknown:
        ap.error(f"unknown workloads {unknown}: known {list(known)}")
    if args.client == "inference-perf":
        rust_only = [w for w in args.workloads.split(",") if known[w].side_gateway]
        if rust_only:
            ap.error(f"{rust_only}: the second gateway's stream is sent by the Rust client only")
    workloads = [known[w] for w in args.workloads.split(",")]
    if args.rates:
        rates = [float(r) for r in args.rates.split(",")]
        workloads = [replace(w, rates=rates) for w in workloads]
    if args.stage_secs is not None:
        if args.stage_secs < 1:
            ap.error("--stage-secs takes a positive number of seconds")
        if args.quick:
            ap.error("--stage-secs and --quick (6 s stages) exclude each other")
        workloads = [replace(w, stage_secs=args.stage_secs) for w in workloads]
    explicit = args.contenders is not None
    contenders = args.contenders.split(",") if explicit else list(CONTENDERS)
    for c in contenders:
        if epp_replicas(c)[0] not in KNOWN:
            sys.exit(f"unknown contender {c!r}; known: {', '.join(KNOWN)}")
    # Precise prefix needs real tokens and KV events; every contender of the
    # run gets the same fleet.
    args.kv_events = any(epp_replicas(c)[0] in PRECISE for c in contenders)
    if args.kv_events:
        log("epp-precise: every simulator of this run tokenizes with the bench tokenizer and "
            "publishes KV events (token blocks, not the 4-byte rule)")
    if args.fleet == "llm-d-sim":
        # The reference reads its endpoints as pods: one IP each, the pool's one port. llm-d's
        # simulator binds every address, so four of them cannot share a port on one machine.
        unfit = [c for c in contenders if c == "reference" or epp_replicas(c)[0] in PRECISE]
        unfit += [f"workload {w.name}" for w in workloads if w.lora or w.speeds]
        if unfit and explicit:
            sys.exit(f"not with --fleet llm-d-sim: {', '.join(unfit)} (the reference needs one port on "
                     "several IPs, which llm-d-inference-sim cannot bind; epp-precise needs epp-sim's KV events "
                     "and tokenizer; the LoRA mix and mixed speeds use epp-sim's flags)")
        contenders = [c for c in contenders if c != "reference" and epp_replicas(c)[0] not in PRECISE]
        workloads = [w for w in workloads if not (w.lora or w.speeds)]
        if not Path(script_out(REFERENCE_SCRIPT, "sim-path")).exists():
            log("building llm-d-inference-sim (cached outside the checkout)")
            subprocess.run(["bash", str(REFERENCE_SCRIPT), "build-sim"], check=True)
        args.llmd_sim_bin = Path(script_out(REFERENCE_SCRIPT, "sim-path"))
    if "reference" in contenders:
        missing = reference_missing()
        if missing and not explicit:
            log("skipping contender 'reference': not built or present:\n  " + "\n  ".join(missing)
                + "\n  (name it in --contenders to build it here: Go, and several minutes on two cores)")
            contenders.remove("reference")
        elif missing:
            log("building the reference picker and the test control plane (cached outside the checkout)")
            subprocess.run(["bash", str(REFERENCE_SCRIPT), "build"], check=True)
            subprocess.run(["bash", str(KUBE_ENV), "build"], check=True)
            missing = reference_missing()
            if missing:
                sys.exit("contender 'reference' needs:\n  " + "\n  ".join(missing))
        if "reference" in contenders:
            args.reference_bin = Path(script_out(REFERENCE_SCRIPT, "path"))
    for path, what in [(args.bin_dir / "epp", "epp (cargo build --release)"),
                       (args.bin_dir / "epp-sim", "epp-sim (cargo build --release)"),
                       (args.tokenizer / "tokenizer.json", "tokenizer (scripts/setup-routing-bench.sh)"),
                       (args.inference_perf, "inference-perf (scripts/setup-routing-bench.sh)")]:
        if not path.exists():
            sys.exit(f"missing {path}: {what}")
    args.out.mkdir(parents=True, exist_ok=True)
    if any((args.client or w.client) == "rust" for w in workloads):
        args.rust_client = rust_client_path()
    (args.out / "meta.json").write_text(json.dumps({
        "started": datetime.now().isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model(),
        "git": subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True).stdout.strip(),
        "fleet": args.fleet,
        "fleet_version": script_out(REFERENCE_SCRIPT, "sim-version") if args.fleet == "llm-d-sim" else None,
        "sim_args": LLMD_SIM_ARGS if args.fleet == "llm-d-sim" else SIM_ARGS,
        "kv_events_and_tokenizer_in_every_sim": args.kv_events,
        "workloads": {w.name: {"description": w.description, "rates": w.rates, "stage_secs": w.stage_secs,
                               "sim_args": w.sim_args, "speeds": w.speeds, "client": args.client or w.client}
                      for w in workloads},
        "command": " ".join(sys.argv),
        "quick": args.quick,
        "contenders": contenders,
        "reference": script_out(REFERENCE_SCRIPT, "version") if "reference" in contenders else None,
        "reference_args": args.reference_args if "reference" in contenders else None,
    }, indent=2))
    failures = []
    args.kube = None
    if "reference" in contenders:
        try:
            args.kube = KubeEnv(args.out)
        except Exception as e:  # the other contenders still run
            log(f"  FAILED: the reference's control plane: {e}")
            failures.append(f"reference: control plane: {e}")
            contenders.remove("reference")
    try:
        run_all(args, workloads, contenders, failures)
    finally:
        if args.kube is not None:
            args.kube.stop()
    subprocess.run([sys.executable, str(Path(__file__).with_name("report.py")), str(args.out)], check=False)
    if failures:
        log("failures:\n  " + "\n  ".join(failures))
        sys.exit(1)


def run_all(args, workloads: list[Workload], contenders: list[str], failures: list[str]) -> None:
    with open(args.out / "results.jsonl", "a") as results:
        for workload in workloads:
            for repeat in range(1, args.repeats + 1):
                # Alternate the order so slow drift of a shared machine does not favour one contender.
                order = contenders if repeat % 2 else list(reversed(contenders))
                for contender in order:
                    try:
                        run_one(args, workload, contender, repeat, results)
                    except Exception as e:  # one contender failing must not lose the others' results
                        log(f"  FAILED: {e}")
                        failures.append(f"{workload.name}/{contender}/{repeat}: {e}")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    main()
