//! A bounded fuzz run on every test run: the request-path fuzz target's own
//! checks (`fuzz/fuzz_targets/check.rs`: body parsing and model splicing,
//! the usage reader and the model restorer) over real request and response
//! bodies and seeded mutations of them. The long campaigns are that target
//! under cargo-fuzz (see `fuzz/Cargo.toml`).

use rand::{Rng, SeedableRng, rngs::SmallRng};

#[path = "../fuzz/fuzz_targets/check.rs"]
mod fuzz_check;

/// Request and response bodies of every API the parser reads.
const SEEDS: &[&str] = &[
    r#"{"model":"llama","prompt":"Hello there","max_tokens":16,"stream":true}"#,
    r#"{"model":"llama","prompt":["a","b"],"cache_salt":"s1"}"#,
    r#"{"model":"llama","prompt":[1,2,3,40000]}"#,
    r#"{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"x"}}]}],"max_completion_tokens":9}"#,
    r#"{"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","content":"42"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"b":1,"a":2}}}]}"#,
    r#"{"model":"m","input":"what?","instructions":"be kind","max_output_tokens":5}"#,
    r#"{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"x"}]}]}"#,
    r#"{"model":"m","items":[{"type":"message","role":"user","content":[{"type":"input_text","text":"y"}]}]}"#,
    r#"{"model":"claude","system":[{"type":"text","text":"sys"}],"messages":[{"role":"user","content":"hey"}],"max_tokens":3}"#,
    r#"{"model":"e5","input":["one","two"]}"#,
    r#"{"id":"c1","model":"lora-7","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15,"prompt_tokens_details":{"cached_tokens":8}}}"#,
    "data: {\"id\":\"c\",\"model\":\"lora\",\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"model\":\"lora\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n",
    "event: message_start\r\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"c\",\"usage\":{\"input_tokens\":7,\"cache_read_input_tokens\":2}}}\r\n\r\nevent: message_delta\r\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":4}}\r\n\r\n",
    // Arrays are not requests nor responses to rewrite (the campaign's first find).
    r#"["lora-7"]"#,
    r#"[{"model":"x"}]"#,
    "data: {\"type\":\"response.completed\",\"response\":{\"model\":\"m\",\"usage\":{\"input_tokens\":3,\"output_tokens\":1,\"input_tokens_details\":{\"cached_tokens\":1}}}}\n",
];

/// Fragments a mutation inserts: JSON structure, the keys the readers look
/// for, escapes, SSE framing.
const TOKENS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    ":",
    ",",
    "\"",
    "\\",
    "\\u00e9",
    "\\ud800",
    "null",
    "true",
    "1e999",
    "-0",
    "\"model\"",
    "\"prompt\"",
    "\"messages\"",
    "\"content\"",
    "\"role\"",
    "\"input\"",
    "\"usage\"",
    "\"stream\"",
    "\"max_tokens\"",
    "\"cache_salt\"",
    "\"text\"",
    "data: ",
    "\n",
    "\r\n",
    "[DONE]",
    "\u{feff}",
    " ",
    "\u{0}",
];

fn input(api: u8, split: u8, body: &[u8]) -> Vec<u8> {
    let mut data = vec![api, split];
    data.extend_from_slice(body);
    data
}

fn mutate(rng: &mut SmallRng, body: &mut Vec<u8>) {
    for _ in 0..rng.random_range(1..6) {
        let at = rng.random_range(0..=body.len());
        match rng.random_range(0..5) {
            0 if at < body.len() => body[at] = rng.random(),
            1 => {
                let t = TOKENS[rng.random_range(0..TOKENS.len())];
                body.splice(at..at, t.bytes());
            }
            2 => {
                let end = (at + rng.random_range(1..24)).min(body.len());
                body.drain(at..end);
            }
            3 => {
                // A piece of another seed.
                let other = SEEDS[rng.random_range(0..SEEDS.len())].as_bytes();
                let from = rng.random_range(0..other.len());
                let to = (from + rng.random_range(1..64)).min(other.len());
                body.splice(at..at, other[from..to].iter().copied());
            }
            _ => body.truncate(at),
        }
    }
}

#[test]
fn checks_hold_on_every_seed_with_every_api_and_split() {
    for seed in SEEDS {
        for api in 0..6 {
            for split in [0, 1, 77, 128, 200, 255] {
                fuzz_check::check(&input(api, split, seed.as_bytes()));
            }
        }
    }
}

#[test]
fn checks_hold_on_mutated_bodies() {
    let mut rng = SmallRng::seed_from_u64(0x5eed_f022);
    for _ in 0..20_000 {
        let mut body = SEEDS[rng.random_range(0..SEEDS.len())].as_bytes().to_vec();
        mutate(&mut rng, &mut body);
        fuzz_check::check(&input(rng.random(), rng.random(), &body));
    }
}

#[test]
fn checks_hold_on_arbitrary_bytes() {
    let mut rng = SmallRng::seed_from_u64(7);
    for _ in 0..5_000 {
        let len = rng.random_range(0..300);
        let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        fuzz_check::check(&data);
    }
}

/// Writes the seeds as a corpus for a cargo-fuzz campaign
/// (`fuzz/corpus/request`, git-ignored).
#[test]
#[ignore = "writes files; run by hand before a campaign"]
fn write_seed_corpus() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/corpus/request");
    std::fs::create_dir_all(dir).unwrap();
    for (i, seed) in SEEDS.iter().enumerate() {
        for api in 0..6u8 {
            std::fs::write(
                format!("{dir}/seed-{i}-{api}"),
                input(api, 128, seed.as_bytes()),
            )
            .unwrap();
        }
    }
}
