use super::*;

/// A template in the shape of Llama 3's: a system header, one header per
/// message, the assistant's header when a reply is wanted.
const HEADERS: &str = "{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- set system = messages[0]['content'] | trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system = '' %}
{%- endif %}
{{- '<|sys|>' + system + '<|end|>' }}
{%- for message in messages %}
    {{- '<|' + message['role'] + '|>' + message['content'] | trim + '<|end|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|assistant|>' }}
{%- endif %}";

fn special() -> SpecialTokens {
    SpecialTokens {
        bos: Some("<s>".into()),
        eos: Some("</s>".into()),
        ..SpecialTokens::default()
    }
}

fn render(template: &str, body: serde_json::Value) -> Result<RenderedChat, Unrendered> {
    ChatTemplate::new(template.to_owned(), special())
        .expect("parses")
        .render(body.to_string().as_bytes())
}

fn text(template: &str, body: serde_json::Value) -> String {
    render(template, body).expect("renders").text
}

#[test]
fn renders_messages_with_special_tokens_and_the_generation_prompt() {
    let body = serde_json::json!({"model": "m", "messages": [
        {"role": "system", "content": " Be brief. "},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    ]});
    let r = render(HEADERS, body.clone()).unwrap();
    assert_eq!(
        r.text,
        "<s><|sys|>Be brief.<|end|><|user|>Hi<|end|><|assistant|>Hello<|end|><|user|>a\nb<|end|><|assistant|>"
    );
    assert!(!r.add_special_tokens, "chat: the template adds them");
    let mut no_prompt = body;
    no_prompt["add_generation_prompt"] = false.into();
    no_prompt["add_special_tokens"] = true.into();
    let r = render(HEADERS, no_prompt).unwrap();
    assert!(r.text.ends_with("a\nb<|end|>"), "{}", r.text);
    assert!(r.add_special_tokens);
}

#[test]
fn templates_that_loop_over_content_get_parts() {
    let parts = "{% for m in messages %}{% for p in m['content'] %}[{{ p.type }}:{{ p.text }}]{% endfor %}{% endfor %}";
    let t = ChatTemplate::new(parts.into(), special()).unwrap();
    assert_eq!(t.content_format(), ContentFormat::OpenAi);
    assert_eq!(
        ChatTemplate::new(HEADERS.into(), special())
            .unwrap()
            .content_format(),
        ContentFormat::String
    );
    let body = serde_json::json!({"messages": [
        {"role": "user", "content": "x"},
        {"role": "user", "content": [{"type": "text", "text": "y"}]},
        {"role": "assistant", "content": null},
    ]});
    assert_eq!(text(parts, body), "[text:x][text:y]");
}

#[test]
fn media_parts_and_own_templates_are_not_rendered_here() {
    let image = serde_json::json!({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": "http://x/cat.png"}},
    ]}]});
    assert!(matches!(
        render(HEADERS, image),
        Err(Unrendered::Unsupported(_))
    ));
    let own = serde_json::json!({"messages": [{"role": "user", "content": "x"}], "chat_template": "{{ 1 }}"});
    assert!(matches!(
        render(HEADERS, own),
        Err(Unrendered::Unsupported(_))
    ));
    for bad in [
        serde_json::json!({"model": "m"}),
        serde_json::json!({"messages": ["x"]}),
        serde_json::json!({"messages": [{"role": "user", "content": 3}]}),
    ] {
        assert!(
            matches!(render(HEADERS, bad.clone()), Err(Unrendered::Failed(_))),
            "{bad}"
        );
    }
    let t = ChatTemplate::new(HEADERS.into(), special()).unwrap();
    assert!(matches!(t.render(b"{not json"), Err(Unrendered::Failed(_))));
}

#[test]
fn raise_exception_fails_the_render_with_its_message() {
    let alternate = "{% for m in messages %}{% if (m.role == 'user') != loop.index0 is even %}\
        {{ raise_exception('roles must alternate') }}{% endif %}{{ m.content }}{% endfor %}";
    let body = serde_json::json!({"messages": [
        {"role": "user", "content": "a"}, {"role": "user", "content": "b"},
    ]});
    match render(alternate, body) {
        Err(Unrendered::Failed(why)) => assert!(why.contains("roles must alternate"), "{why}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn tojson_writes_what_pythons_json_dumps_writes() {
    // Raw JSON: the client's key order is what Python keeps.
    let body = r#"{"messages": [], "tools": [{"type": "function", "function": {
        "name": "get_weather", "z": 1, "a": [1.5, 1e-7, 2e16, 0.0001, -3], "s": "é\"\\\n\t\u0001<>&",
        "n": null, "t": true, "e": {}, "l": []}}]}"#;
    let t = |template: &str| {
        ChatTemplate::new(template.to_owned(), special())
            .unwrap()
            .render(body.as_bytes())
            .unwrap()
            .text
    };
    assert_eq!(
        t("{{ tools[0] | tojson }}"),
        r#"{"type": "function", "function": {"name": "get_weather", "description": null, "parameters": null, "z": 1, "a": [1.5, 1e-07, 2e+16, 0.0001, -3], "s": "é\"\\\n\t\u0001<>&", "n": null, "t": true, "e": {}, "l": []}}"#
    );
    assert_eq!(
        t("{{ tools[0].function.a | tojson(indent=2) }}"),
        "[\n  1.5,\n  1e-07,\n  2e+16,\n  0.0001,\n  -3\n]"
    );
    assert_eq!(
        t("{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }}"),
        r#"{"a": 2, "b": 1}"#
    );
}

#[test]
fn tools_reach_the_template_as_vllms_models_dump_them() {
    let body = r#"{"messages": [], "tools": [
        {"function": {"name": "f"}, "x": 1},
        {"function": {"parameters": {"b": 1, "a": 2}, "strict": true, "name": "g", "description": "G"}, "type": "function"},
        {"type": "function", "function": {"description": "no name"}},
        "not a tool"]}"#;
    let text = ChatTemplate::new("{{ tools | tojson }}".to_owned(), special())
        .unwrap()
        .render(body.as_bytes())
        .unwrap()
        .text;
    assert_eq!(
        text,
        r#"[{"type": "function", "function": {"name": "f", "description": null, "parameters": null}, "x": 1}, {"type": "function", "function": {"name": "g", "description": "G", "parameters": {"b": 1, "a": 2}, "strict": true}}, {"type": "function", "function": {"description": "no name"}}, "not a tool"]"#
    );
}

#[test]
fn tool_call_arguments_are_parsed_and_kwargs_reach_the_template() {
    let t = "{% for m in messages %}{% for c in m.tool_calls %}{{ c.function.name }}({{ c.function.arguments.city }}){% endfor %}{% endfor %}{{ enable_thinking }}";
    let body = serde_json::json!({
        "messages": [{"role": "assistant", "content": null, "tool_calls": [
            {"id": "1", "type": "function", "function": {"name": "w", "arguments": "{\"city\": \"Oslo\"}"}},
        ]}],
        "chat_template_kwargs": {"enable_thinking": false},
    });
    // Python writes booleans capitalised.
    assert_eq!(text(t, body), "w(Oslo)False");
}

#[test]
fn continue_final_message_ends_at_the_last_messages_content() {
    let body = serde_json::json!({"continue_final_message": true, "messages": [
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "The answer is"},
    ]});
    assert_eq!(
        text(HEADERS, body),
        "<s><|sys|><|end|><|user|>Hi<|end|><|assistant|>The answer is"
    );
    // A template reading parts: cut after the last part's text.
    let parts = "{% for m in messages %}<{{ m.role }}>{% for p in m.content %}{{ p.text }}|{% endfor %}</{{ m.role }}>{% endfor %}";
    let body = serde_json::json!({"continue_final_message": true, "messages": [
        {"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    ]});
    assert_eq!(text(parts, body), "<assistant>a|b");
}

#[test]
fn strftime_formats_utc_dates() {
    assert_eq!(strftime("%d %b %Y", 0), "01 Jan 1970");
    // 2024-02-29 13:05:09 UTC, a Thursday, day 60 of a leap year.
    let t = 1_709_211_909;
    assert_eq!(
        strftime("%A %a %d %B %m %y %H:%M:%S %j %% %Q", t),
        "Thursday Thu 29 February 02 24 13:05:09 060 % %Q"
    );
}

#[test]
fn the_template_and_special_tokens_are_found_beside_the_tokenizer() {
    let dir = epp_test_support::process::scratch_dir("chat-template-beside");
    let tokenizer = dir.join("tokenizer.json");
    assert!(
        ChatTemplate::beside(&tokenizer).unwrap().is_none(),
        "no files: no template"
    );
    let config = serde_json::json!({
        "bos_token": {"content": "<B>", "lstrip": false},
        "eos_token": "<E>",
        "chat_template": [
            {"name": "tool_use", "template": "tools"},
            {"name": "default", "template": "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"},
        ],
    });
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
    let body = br#"{"messages": [{"role": "user", "content": "x"}]}"#;
    let t = ChatTemplate::beside(&tokenizer).unwrap().unwrap();
    assert_eq!(t.render(body).unwrap().text, "<B>x<E>");
    // chat_template.jinja wins over the config's.
    std::fs::write(
        dir.join("chat_template.jinja"),
        "[{{ messages[0].content }}]",
    )
    .unwrap();
    let t = ChatTemplate::beside(&tokenizer).unwrap().unwrap();
    assert_eq!(t.render(body).unwrap().text, "[x]");
    std::fs::write(dir.join("chat_template.jinja"), "{% if %}").unwrap();
    assert!(
        ChatTemplate::beside(&tokenizer).is_err(),
        "a bad template is an error"
    );
}

#[test]
fn transformers_generation_tags_render_their_content() {
    let t = "{% for m in messages %}{% if m.role == 'assistant' %}{%- generation -%} [{{ m.content }}] {%- endgeneration -%}{% else %}{{ m.content }}{% endif %}{% endfor %}";
    let body = serde_json::json!({"messages": [
        {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
    ]});
    assert_eq!(text(t, body), "q[a]");
    assert_eq!(
        without_generation_tags("a {% if x %}{%generation%}b{% endgeneration%}{% endif %}"),
        "a {% if x %}{% if true %}b{% endif %}{% endif %}"
    );
}
