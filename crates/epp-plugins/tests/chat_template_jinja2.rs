//! epp's in-process chat templates against Jinja2 itself, set up as Hugging
//! Face `transformers` sets it up to render chat templates (the engines'
//! renderer): the same templates and requests must give the same text.
//!
//! The requests' messages are already in the form vLLM hands templates
//! (string content for templates that read strings, parts for those that
//! loop over content), so the comparison is of the template engines alone;
//! the messages' normalisation has its own unit tests. The tools go
//! through pydantic on the Python side, in models with vLLM's fields and
//! defaults (`ChatCompletionToolsParam`, `FunctionDefinition`, extra keys
//! allowed), dumped as vLLM dumps them: epp's own tool normalisation is
//! checked against pydantic's.
//!
//! Needs `.venv/bin/python` with `jinja2` and `pydantic` (`scripts/setup.sh`
//! installs them).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{io::Write, process::Stdio};

use epp_plugins::{ChatTemplate, SpecialTokens, Unrendered};
use serde_json::json;

/// transformers' chat-template environment, and one render per case.
const JINJA2: &str = r#"
import json, sys
from datetime import datetime
import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from typing import Any, Literal, Optional
from pydantic import BaseModel, ConfigDict

class Model(BaseModel):
    model_config = ConfigDict(extra="allow")

class FunctionDefinition(Model):
    name: str
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None

class ChatCompletionToolsParam(Model):
    type: Literal["function"] = "function"
    function: FunctionDefinition

def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)

def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

def strftime_now(format):
    return datetime.now().strftime(format)

env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
env.globals["strftime_now"] = strftime_now
out = []
for case in json.load(sys.stdin):
    body = case["body"]
    ctx = {"messages": body["messages"], "add_generation_prompt": body.get("add_generation_prompt", True)}
    if body.get("tools") is not None:
        ctx["tools"] = [ChatCompletionToolsParam.model_validate(t).model_dump() for t in body["tools"]]
    if body.get("documents") is not None:
        ctx["documents"] = body["documents"]
    ctx.update(case["special"])
    ctx.update(body.get("chat_template_kwargs") or {})
    try:
        out.append({"ok": env.from_string(case["template"]).render(**ctx)})
    except Exception as e:
        out.append({"err": str(e)})
print(json.dumps(out))
"#;

const HEADERS_WITH_TOOLS: &str = r##"{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] | trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{{- "Today Date: " + strftime_now("%d %b %Y") + "\n\n" }}
{%- if tools is not none and tools is defined %}
    {{- "You may call these functions:\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {%- if message.role == 'assistant' and message.tool_calls is defined %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
        {%- for call in message.tool_calls %}
            {{- '{"name": "' + call.function.name + '", "parameters": ' + call.function.arguments | tojson + '}' }}
        {%- endfor %}
        {{- "<|eot_id|>" }}
    {%- else %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"##;

const CHATML: &str = r##"{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools><|im_end|>\n" }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- set ns = namespace(last_user=-1) %}
{%- for message in messages %}
    {%- if message.role == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.role == "user" or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content.split('</think>')[-1].lstrip('\n') }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}{% set tool_call = tool_call.function %}{% endif %}
            {{- '\n<tool_call>\n{"name": "' + tool_call.name + '", "arguments": ' + tool_call.arguments | tojson + '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}{{- '<|im_start|>user' }}{% endif %}
        {{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}{{- '<|im_end|>\n' }}{% endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{% endif %}
{%- endif %}
"##;

const ALTERNATING: &str = r##"{{- bos_token }}
{%- for message in messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.last and messages | length > 2 %}{{- '[INST] ' + message['content'] + ' [/INST]' }}
        {%- else %}{{- '[INST] ' + message['content'] | upper | replace('HELLO', 'Hello') + ' [/INST]' }}{% endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token }}
    {%- else %}
        {%- break %}
    {%- endif %}
{%- endfor %}
"##;

const PARTS: &str = r##"{{ bos_token }}{% for message in messages %}{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}<start_of_turn>{{ role }}
{% if message['content'] is string %}{{ message['content'] | trim }}{% else %}{% for item in message['content'] %}{% if item['type'] == 'text' %}{{ item['text'] | trim }}{% endif %}{% if not loop.last %} {% endif %}{% endfor %}{% endif %}<end_of_turn>
{% endfor %}{% if add_generation_prompt %}<start_of_turn>model
{% endif %}
{%- for d in documents | default([]) %}{{ loop.index }}. {{ d.title | default('untitled') }}: {{ d['text'][:12] }}{{ '…' if d['text'] | length > 12 }}
{% endfor %}
{%- for k, v in (meta | default({})).items() | sort %}{{ k }}={{ v }}{% if v is number %}(n){% endif %}{{ ',' if not loop.last }}{% endfor %}"##;

fn special(bos: &str, eos: &str) -> SpecialTokens {
    SpecialTokens {
        bos: Some(bos.into()),
        eos: Some(eos.into()),
        ..SpecialTokens::default()
    }
}

#[test]
fn in_process_templates_render_as_jinja2_renders_them() {
    let weather = json!({"type": "function", "function": {
        "name": "get_weather", "description": "Weather in a city, «today».",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "maximum": 7.5}}, "required": ["city"]},
    }});
    // Without the optional fields, with keys of the client's own.
    let now = json!({"function": {"name": "now", "strict": true}, "x_origin": "client"});
    let cases = [
        (
            HEADERS_WITH_TOOLS,
            json!({"messages": [
            {"role": "system", "content": "  You are terse.\n"},
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}}]},
            {"role": "tool", "content": "{\"temp\": -3}"},
        ], "tools": [weather.clone()]}),
        ),
        (
            HEADERS_WITH_TOOLS,
            json!({"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": false}),
        ),
        (
            CHATML,
            json!({"messages": [
            {"role": "system", "content": "Sys"},
            {"role": "user", "content": "Find it"},
            {"role": "assistant", "content": "<think>hmm</think>\n\nCalling.", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Bergen"}}}]},
            {"role": "tool", "content": "rain"},
            {"role": "tool", "content": "wind"},
            {"role": "user", "content": "Thanks"},
        ], "tools": [weather, now], "chat_template_kwargs": {"enable_thinking": false}}),
        ),
        (
            CHATML,
            json!({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}, {"role": "system", "content": "S2"}]}),
        ),
        (
            ALTERNATING,
            json!({"messages": [
                {"role": "user", "content": "hello there"}, {"role": "assistant", "content": "Hi."}, {"role": "user", "content": "Bye"},
            ]}),
        ),
        (
            ALTERNATING,
            json!({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}),
        ),
        (
            ALTERNATING,
            json!({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}, {"role": "tool", "content": "d"}, {"role": "user", "content": "e"}]}),
        ),
        (
            PARTS,
            json!({"messages": [
            {"role": "user", "content": [{"type": "text", "text": " Describe "}, {"type": "text", "text": "it "}]},
            {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]},
        ], "documents": [{"title": "Cats", "text": "Cats are small carnivores."}, {"text": "Short"}],
           "chat_template_kwargs": {"meta": {"b": 2, "a": "x", "c": 1.5}}}),
        ),
    ];
    let specials = [
        ("<|begin_of_text|>", "<|eot_id|>"),
        ("", "<|im_end|>"),
        ("<s>", "</s>"),
        ("<bos>", "<eos>"),
    ];
    let special_of = |template: &str| {
        let (bos, eos) = match template {
            t if t == HEADERS_WITH_TOOLS => specials[0],
            t if t == CHATML => specials[1],
            t if t == ALTERNATING => specials[2],
            _ => specials[3],
        };
        special(bos, eos)
    };
    let input: Vec<serde_json::Value> = cases
        .iter()
        .map(|(template, body)| {
            let s = special_of(template);
            json!({"template": template, "body": body, "special": {
                "bos_token": s.bos, "eos_token": s.eos,
            }})
        })
        .collect();

    let python = epp_test_support::process::workspace_root().join(".venv/bin/python");
    let mut child = std::process::Command::new(&python)
        .args(["-c", JINJA2])
        .env("TZ", "UTC")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e} (run scripts/setup.sh)", python.display()));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(serde_json::to_vec(&input).unwrap().as_slice())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "jinja2 failed (is it installed? run scripts/setup.sh): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let expected: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(expected.len(), cases.len());

    let mut failures = 0;
    for (i, ((template, body), want)) in cases.iter().zip(&expected).enumerate() {
        let t = ChatTemplate::new((*template).to_owned(), special_of(template)).expect("parses");
        let got = t.render(body.to_string().as_bytes());
        match (want.get("ok").and_then(|v| v.as_str()), &got) {
            (Some(want), Ok(got)) => assert_eq!(got.text, want, "case {i}"),
            (None, Err(Unrendered::Failed(why))) => {
                failures += 1;
                let python_error = want["err"].as_str().unwrap();
                assert!(
                    why.contains(python_error),
                    "case {i}: {why} vs {python_error}"
                );
            }
            (want, got) => panic!("case {i}: jinja2 {want:?}, epp {got:?}"),
        }
    }
    assert_eq!(
        failures, 1,
        "the non-alternating conversation fails in both"
    );
}
