//! llm-d's shipped `EndpointPickerConfig` files (`shared/reference/llm-d-configs`,
//! beside the checkout; read, never copied) loaded with every plugin type the
//! `epp` binary registers, as `epp --check-config` loads them.

use epp_core::{
    EndpointId, EndpointSnapshot, InferenceRequest, Registry,
    config::{BuiltConfig, EndpointPickerConfig},
};
use epp_test_support::endpoints::with_roles;

/// The registry of the `epp` binary: scheduling built-ins and the data
/// layer's types.
fn registry() -> Registry {
    let mut r = Registry::new();
    epp_plugins::register_builtins(&mut r);
    epp_datalayer::register(&mut r);
    r
}

fn text_of(file: &str) -> String {
    let path = format!(
        "{}/../../../shared/reference/llm-d-configs/{file}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn load(file: &str) -> Result<BuiltConfig, String> {
    EndpointPickerConfig::parse(&text_of(file), file)
        .and_then(|c| c.build(&registry()))
        .map_err(|e| e.to_string())
}

fn names(built: &BuiltConfig) -> Vec<&str> {
    built.plugins.iter().map(|(n, _)| n.as_str()).collect()
}

fn request(prompt: String) -> InferenceRequest {
    InferenceRequest::builder("m").prompt(prompt).build()
}

// Blocks of the default 16 tokens are 64 characters.
const BLOCK: usize = 64;

/// All 19 files llm-d ships.
const LOADING: &[&str] = &[
    "dp-epp-config.yaml",
    "epp-burst-prefix-cache-config.yaml",
    "epp-config.yaml",
    "epp-estimate-prefix-cache-config.yaml",
    "epp-mm-embeddings-cache-config.yaml",
    "epp-precise-prefix-cache-config.yaml",
    "pd-epp-config.yaml",
    "pd-topology-epp-config.yaml",
    "probabilistic-admitter-epp-config.yaml",
    "sim-e-p-d-epp-config.yaml",
    "sim-e-pd-epp-config.yaml",
    "sim-epp-config.yaml",
    "sim-epp-gpu-config.yaml",
    "sim-epp-kvcache-config.yaml",
    "sim-epp-no-hit-lru.yaml",
    "sim-epp-tokenizer-vllm-http-config.yaml",
    "sim-pd-epp-config.yaml",
    "sim-program-aware-config.yaml",
    "soft-reflective-ceiling-epp-config.yaml",
];

#[test]
fn llm_ds_shipped_configs_load() {
    assert_eq!(LOADING.len(), 19);
    let failures: Vec<String> = LOADING
        .iter()
        .filter_map(|f| load(f).err().map(|e| format!("{f}: {e}")))
        .collect();
    assert!(failures.is_empty(), "{failures:#?}");
}

/// llm-d's `sim-epp-no-hit-lru.yaml`: `prefix-cache-scorer` reads the
/// precise producer, `no-hit-lru-scorer` (no producer named) the default
/// `approx-prefix-cache-producer`, which is created, as llm-d creates it,
/// and fills a second set of matches. Cold or warm is judged on that set:
/// the precise producer matches nothing here (no token-producer), yet a
/// repeated prompt is warm for the LRU scorer and does not move its LRU.
#[test]
fn readers_of_different_producers_each_read_their_own() {
    let built = load("sim-epp-no-hit-lru.yaml").unwrap();
    assert!(
        names(&built).contains(&"approx-prefix-cache-producer"),
        "{:?}",
        names(&built)
    );
    let snapshot = EndpointSnapshot::new(with_roles(&[Some("decode"); 3]));
    let pick = |prompt: &str| {
        built
            .scheduler
            .schedule(&request(prompt.to_owned()), &snapshot)
            .unwrap()
            .primary()
            .unwrap()
            .id()
    };
    let (p, q, r) = (
        "p".repeat(4 * BLOCK),
        "q".repeat(4 * BLOCK),
        "r".repeat(4 * BLOCK),
    );
    // Cold: never-used endpoints first, in order.
    assert_eq!(pick(&p), EndpointId(0));
    assert_eq!(pick(&q), EndpointId(1));
    // Warm on the approximate index (whatever it picks, the LRU stays)...
    let _ = pick(&p);
    // ...so the next cold request goes to the one never used. Judged on
    // the precise producer's empty matches, `p` would have been cold, gone
    // to endpoint 2, and `r` to endpoint 0.
    assert_eq!(pick(&r), EndpointId(2));
}

/// `epp-mm-embeddings-cache-config.yaml` and `epp-burst-prefix-cache-config.yaml`
/// as shipped: their token producer asks the engine to render prompts
/// (llm-d's `vllm` backend), and what they name loads (the multimodal
/// producer listed as an endpoint-notification extractor included).
#[test]
fn the_multimodal_and_burst_configs_load_with_their_vllm_token_producer() {
    for (file, wanted) in [
        (
            "epp-mm-embeddings-cache-config.yaml",
            "mm-embeddings-cache-producer",
        ),
        (
            "epp-burst-prefix-cache-config.yaml",
            "burst-prefix-cache-producer",
        ),
    ] {
        let built = load(file).unwrap_or_else(|e| panic!("{e}"));
        let render = built
            .plugins
            .iter()
            .find_map(|(_, p)| p.plugin().render_service())
            .expect("the token producer asks for rendering");
        assert_eq!(render.model, "hf-repo/model-name", "{file}");
        assert!(names(&built).contains(&wanted), "{file}");
        // Only KV-event consumers are fed by a notification source.
        let fed: Vec<&str> = built
            .data_layer
            .iter()
            .filter(|s| s.source.plugin().as_notification_source().is_some())
            .flat_map(|s| s.extractors.iter().map(|e| e.plugin().name()))
            .collect();
        assert!(
            fed.iter().all(|n| *n == "precise-prefix-cache-producer"),
            "{file}: {fed:?}"
        );
    }
}

/// llm-d's `dataLayer.discovery` naming a `file-discovery` plugin: the built
/// config carries the plugin, which names the file the binary watches in
/// place of Kubernetes discovery; a plugin of another kind is refused.
#[test]
fn data_layer_discovery_names_a_file_discovery_plugin() {
    let text = "\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: file-discovery
  name: files
  parameters: {path: /etc/epp/endpoints.yaml, watchFile: true}
- type: queue-scorer
dataLayer:
  discovery: {pluginRef: files}
";
    let built = EndpointPickerConfig::parse(text, "d.yaml")
        .and_then(|c| c.build(&registry()))
        .unwrap_or_else(|e| panic!("{e}"));
    let file = built
        .discovery
        .as_ref()
        .and_then(|d| d.plugin().as_endpoint_discovery())
        .and_then(|d| d.endpoints_file())
        .map(|p| p.display().to_string());
    assert_eq!(file.as_deref(), Some("/etc/epp/endpoints.yaml"));
    let wrong = text.replace("{pluginRef: files}", "{pluginRef: queue-scorer}");
    let err = EndpointPickerConfig::parse(&wrong, "d.yaml")
        .and_then(|c| c.build(&registry()))
        .unwrap_err()
        .to_string();
    assert!(err.contains("is not an endpoint-discovery plugin"), "{err}");
    let no_path = text.replace("path: /etc/epp/endpoints.yaml, ", "");
    assert!(
        EndpointPickerConfig::parse(&no_path, "d.yaml")
            .and_then(|c| c.build(&registry()))
            .is_err()
    );
}
