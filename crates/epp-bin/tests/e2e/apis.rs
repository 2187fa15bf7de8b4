//! Every inference API epp parses, through Envoy to simulators that serve it:
//! completions (string and list prompts), chat (string and typed-part
//! content), Responses, Conversations, Anthropic Messages and embeddings.
//! For each, a tenant's requests keep going to the simulator that holds its
//! prefix, and equivalent spellings of one request route alike (also across
//! APIs: a Responses prompt and the same turns as Conversations items); a
//! body without `model` is refused by epp with 400 before it reaches any
//! server.

use std::collections::HashMap;

use serde_json::{Value, json};

use epp_test_support::{
    http,
    process::{BodyMode, Stack},
};

const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";
const TENANTS: usize = 3;
const PER_TENANT: usize = 4;

/// One way of asking: path, and the body for a system prompt and a question.
struct Kind {
    name: &'static str,
    path: &'static str,
    body: fn(&str, &str) -> Value,
    /// What the server's reply says it is, to check the reply came through.
    reply_object: (&'static str, &'static str),
}

const KINDS: [Kind; 8] = [
    Kind {
        name: "completions",
        path: "/v1/completions",
        body: |s, q| json!({"model": MODEL, "prompt": format!("{s}{q}"), "max_tokens": 2}),
        reply_object: ("object", "text_completion"),
    },
    Kind {
        name: "completions-list",
        path: "/v1/completions",
        body: |s, q| json!({"model": MODEL, "prompt": [format!("{s}{q}")], "max_tokens": 2}),
        reply_object: ("object", "text_completion"),
    },
    Kind {
        name: "chat",
        path: "/v1/chat/completions",
        body: |s, q| {
            json!({"model": MODEL, "max_tokens": 2, "messages": [
                {"role": "system", "content": s}, {"role": "user", "content": q}]})
        },
        reply_object: ("object", "chat.completion"),
    },
    Kind {
        name: "chat-parts",
        path: "/v1/chat/completions",
        body: |s, q| {
            json!({"model": MODEL, "max_tokens": 2, "messages": [
                {"role": "system", "content": [{"type": "text", "text": s}]},
                {"role": "user", "content": [{"type": "text", "text": q}]}]})
        },
        reply_object: ("object", "chat.completion"),
    },
    Kind {
        name: "responses",
        path: "/v1/responses",
        body: |s, q| json!({"model": MODEL, "instructions": s, "input": q, "max_output_tokens": 2}),
        reply_object: ("object", "response"),
    },
    Kind {
        name: "conversations",
        path: "/v1/conversations",
        body: |s, q| {
            json!({"model": MODEL, "items": [
                {"type": "message", "role": "system", "content": s},
                {"type": "message", "role": "user",
                 "content": [{"type": "input_text", "text": q}]}]})
        },
        reply_object: ("object", "conversation"),
    },
    Kind {
        name: "messages",
        path: "/v1/messages",
        body: |s, q| {
            json!({"model": MODEL, "system": s, "max_tokens": 2,
                   "messages": [{"role": "user", "content": q}]})
        },
        reply_object: ("type", "message"),
    },
    Kind {
        name: "embeddings",
        path: "/v1/embeddings",
        body: |s, q| json!({"model": MODEL, "input": format!("{s}{q}")}),
        reply_object: ("object", "list"),
    },
];

fn system_prompt(kind: &str, tenant: usize) -> String {
    format!("Tenant {tenant} ({kind}) system prompt: answer briefly and cite sources. ").repeat(40)
}

/// Sends one request; returns the simulator that served it.
async fn served_by(stack: &Stack, kind: &Kind, system: &str, question: &str) -> usize {
    let r = http::post_json(stack.envoy.port, kind.path, &(kind.body)(system, question))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}: {}", kind.name, r.text());
    let (field, want) = kind.reply_object;
    assert_eq!(r.json()[field], want, "{}: {}", kind.name, r.text());
    stack
        .sim_index(r.header("x-inference-pod").expect("pod header"))
        .expect("a known simulator")
}

async fn every_api_kind_routes_by_its_prefix(mode: BodyMode) {
    let stack = Stack::start("apis", 4, &[], &[], mode);
    // Where each (kind, tenant) lives, from the first pass over the kinds.
    let mut homes: HashMap<(&str, usize), usize> = HashMap::new();
    for kind in &KINDS {
        for tenant in 0..TENANTS {
            let system = system_prompt(kind.name, tenant);
            let mut seen = Vec::new();
            for i in 0..PER_TENANT {
                seen.push(served_by(&stack, kind, &system, &format!("Question {i}?")).await);
            }
            // The first request of a tenant has no prefix to follow; the rest must.
            assert!(
                seen[1..].iter().all(|&s| s == seen[0]),
                "{}: tenant {tenant} should stay on the simulator of its first request: {seen:?}",
                kind.name
            );
            homes.insert((kind.name, tenant), seen[0]);
        }
    }

    // Equivalent spellings hash alike: a tenant's string prompt cached by one
    // spelling is found by the other (string vs list prompt, string vs parts,
    // Responses instructions + input vs Conversations items).
    for (a, b) in [
        ("completions", "completions-list"),
        ("chat", "chat-parts"),
        ("responses", "conversations"),
    ] {
        let kind_b = KINDS.iter().find(|k| k.name == b).unwrap();
        for tenant in 0..TENANTS {
            let sim = served_by(
                &stack,
                kind_b,
                &system_prompt(a, tenant),
                "Another question?",
            )
            .await;
            assert_eq!(
                sim,
                homes[&(a, tenant)],
                "{b} spelling of {a} tenant {tenant}'s prompt should find its prefix"
            );
        }
    }

    // No model: epp refuses the request itself, for every kind.
    for kind in &KINDS {
        let mut body = (kind.body)("system", "question");
        body.as_object_mut().unwrap().remove("model");
        let r = http::post_json(stack.envoy.port, kind.path, &body)
            .await
            .unwrap();
        assert_eq!(r.status, 400, "{}: {}", kind.name, r.text());
        assert!(
            r.header("x-inference-pod").is_none(),
            "{}: the refusal must come from epp, not a model server",
            kind.name
        );
        assert!(r.text().contains("model"), "{}: {}", kind.name, r.text());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_api_kind_routes_by_its_prefix_buffered() {
    every_api_kind_routes_by_its_prefix(BodyMode::Buffered).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_api_kind_routes_by_its_prefix_streamed() {
    every_api_kind_routes_by_its_prefix(BodyMode::Streamed).await;
}
