use std::sync::Arc;

use super::*;
use crate::{
    Candidate, CycleContext, Picker, Plugin, ProfileHandler, ProfilePicks, Role, SchedulingProfile,
    Scorer, SingleProfileHandler,
};

#[derive(Debug)]
struct Test {
    name: String,
    kind: &'static str,
}
impl Plugin for Test {
    fn type_name(&self) -> &str {
        self.kind
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_scorer(&self) -> Option<&dyn Scorer> {
        (self.kind == "s").then_some(self)
    }
    fn as_picker(&self) -> Option<&dyn Picker> {
        (self.kind == "max-score-picker").then_some(self)
    }
    fn as_profile_handler(&self) -> Option<&dyn ProfileHandler> {
        (self.kind == "h").then_some(self)
    }
    fn as_replica_syncer(&self) -> Option<&dyn crate::replicas::ReplicaSyncer> {
        (self.kind == "syncer").then_some(self)
    }
    fn as_peer_discovery(&self) -> Option<&dyn crate::replicas::PeerDiscovery> {
        (self.kind == "peers").then_some(self)
    }
}
impl crate::replicas::ReplicaSyncer for Test {
    fn listen_address(&self) -> Option<std::net::SocketAddr> {
        None
    }
}
impl crate::replicas::PeerDiscovery for Test {
    fn peer_addresses(&self) -> &[String] {
        &[]
    }
}
impl Scorer for Test {
    fn score(&self, _: &CycleContext<'_>, _: &[Candidate], _: &mut [f64]) {}
}
impl Picker for Test {
    fn pick(&self, _: &mut CycleContext<'_>, _: &[Candidate], _: &[f64], out: &mut Vec<usize>) {
        out.push(0);
    }
}
impl ProfileHandler for Test {
    fn next_profile(
        &self,
        _: &mut CycleContext<'_>,
        _: &[SchedulingProfile],
        runs: &[ProfilePicks],
    ) -> Option<usize> {
        runs.is_empty().then_some(0)
    }
    fn primary(&self, _: &[SchedulingProfile], _: &[ProfilePicks]) -> Option<usize> {
        Some(0)
    }
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Params {
    #[serde(default)]
    threshold: u32,
}

fn registry() -> Registry {
    let mut r = Registry::new();
    for kind in ["s", "max-score-picker", "h", "syncer", "peers"] {
        r.register(kind, move |spec| {
            let p: Params = spec.params()?;
            if p.threshold > 100 {
                return Err(spec.invalid("threshold", p.threshold, "must be at most 100"));
            }
            Ok(Arc::new(Test {
                name: spec.name.clone(),
                kind,
            }))
        });
    }
    r.register(SingleProfileHandler::TYPE, |spec| {
        Ok(Arc::new(SingleProfileHandler::new(spec.name.clone())))
    });
    r.set_default(Role::Picker, "max-score-picker")
        .set_default(Role::ProfileHandler, SingleProfileHandler::TYPE);
    r
}

fn error(text: &str) -> String {
    match EndpointPickerConfig::parse(text, "f.yaml") {
        Err(e) => e.to_string(),
        Ok(c) => c.build(&registry()).map(|_| ()).unwrap_err().to_string(),
    }
}

#[test]
fn every_validation_error_names_file_line_column_and_field() {
    let cases: &[(&str, &str)] = &[
        (
            "plugins:\n- type: s\n  nmae: x\n",
            "f.yaml:3:3: plugins[0]: unknown field `nmae`",
        ),
        (
            "plugins:\n- type: nope\n",
            "f.yaml:2:3: plugins[0].type: unknown plugin type \"nope\"",
        ),
        (
            "plugins:\n- type: s\nschedulingProfiles:\n- name: p\n  plugins:\n  - pluginRef: missing\n",
            "f.yaml:6:5: schedulingProfiles[0].plugins[0].pluginRef: no plugin named \"missing\" is declared",
        ),
        (
            "plugins:\n- type: s\n- type: s\n",
            "f.yaml:3:3: plugins[1].type: duplicate plugin name \"s\"",
        ),
        (
            "plugins:\n- {type: h, name: a}\n- {type: h, name: b}\n",
            "f.yaml:3:3: plugins[1]: only one profile handler may be declared",
        ),
        (
            "plugins:\n- type: s\nschedulingProfiles:\n- name: a\n- name: b\n",
            "f.yaml:5:3: schedulingProfiles[1]: single-profile-handler runs one profile, but 2 are declared",
        ),
        (
            "plugins:\n- type: s\n  parameters:\n    threshold: lots\n",
            "f.yaml:3:3: plugins[0].parameters: bad parameters for \"s\": invalid type: string \"lots\", expected u32",
        ),
        (
            "plugins:\n- type: s\n  parameters:\n    threshold: 101\n",
            "f.yaml:4:5: plugins[0].parameters.threshold: 101: must be at most 100",
        ),
        (
            "featureGates: [warpDrive]\n",
            "f.yaml:1:16: featureGates[0]: unknown feature gate \"warpDrive\"",
        ),
        (
            "plugins:\n- type: s\n  weight: 2\n",
            "f.yaml:3:3: plugins[0]: unknown field `weight`",
        ),
    ];
    for (text, want) in cases {
        let got = error(text);
        assert!(
            got.starts_with(want),
            "for\n{text}\ngot:  {got}\nwant: {want}"
        );
    }
}

#[test]
fn defaults_fill_profile_handler_picker_and_weights() {
    let c = EndpointPickerConfig::parse(
        "plugins:\n- {type: s, name: a}\n- {type: s, name: b}\n",
        "f",
    )
    .unwrap();
    let built = c.build(&registry()).unwrap();
    let profile = &built.scheduler.profiles()[0];
    assert_eq!(profile.name(), "default");
    assert_eq!(profile.scorers().len(), 2);
    assert!(profile.scorers().iter().all(|s| s.weight == 1.0));
    assert_eq!(
        profile.picker().unwrap().plugin().type_name(),
        "max-score-picker"
    );
    let y = &built.effective_yaml;
    assert!(y.contains("single-profile-handler"), "{y}");
    assert!(y.contains("pluginRef: a\n    weight: 1.0"), "{y}");
    // Re-parsing the effective config gives the same effective config.
    let again = EndpointPickerConfig::parse(y, "eff")
        .unwrap()
        .build(&registry())
        .unwrap();
    assert_eq!(&again.effective_yaml, y);
}

#[test]
fn data_and_data_layer_are_both_accepted_but_not_together() {
    assert!(
        EndpointPickerConfig::parse("data: {sources: []}\n", "f")
            .unwrap()
            .build(&registry())
            .is_ok()
    );
    assert!(
        EndpointPickerConfig::parse("dataLayer: {sources: []}\n", "f")
            .unwrap()
            .build(&registry())
            .is_ok()
    );
    assert!(error("data: {sources: []}\ndataLayer: {sources: []}\n").contains("not both"));
    assert!(
        error("dataLayer:\n  sources:\n  - pluginRef: x\n")
            .contains("dataLayer.sources[0].pluginRef: no plugin named")
    );
}

#[test]
fn the_default_config_is_the_registrys() {
    let none = EndpointPickerConfig::default_config(&registry()).unwrap_err();
    assert_eq!(
        none.to_string(),
        "<default config>:0:0: no config was given and the plugin registry has no default config"
    );
    let mut r = registry();
    r.set_default_config("plugins:\n- type: s\n- {type: s, name: t}\nschedulingProfiles:\n- name: p\n  plugins:\n  - {pluginRef: s, weight: 3}\n");
    let c = EndpointPickerConfig::default_config(&r).unwrap();
    assert_eq!(c.raw.plugins.len(), 2);
    assert_eq!(c.raw.scheduling_profiles[0].plugins[0].weight, Some(3.0));
    r.set_default_config("plugins:\n- tpye: s\n");
    let bad = EndpointPickerConfig::default_config(&r).unwrap_err();
    assert!(
        bad.to_string()
            .starts_with("<default config>:2:3: plugins[0]: unknown field `tpye`"),
        "{bad}"
    );
    assert!(
        EndpointPickerConfig::parse("apiVersion: v9\n", "f")
            .unwrap()
            .build(&registry())
            .is_err()
    );
    assert!(
        EndpointPickerConfig::parse(
            "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n",
            "f"
        )
        .is_ok()
    );
}

#[test]
fn a_role_without_a_default_is_an_error_naming_the_role_or_left_empty() {
    let text = "plugins:\n- type: s\n";
    let build = |r: &Registry| {
        EndpointPickerConfig::parse(text, "f.yaml")
            .unwrap()
            .build(r)
            .map(|b| b.effective_yaml)
    };
    let mut r = Registry::new();
    r.register("s", |spec| {
        Ok(Arc::new(Test {
            name: spec.name.clone(),
            kind: "s",
        }))
    });
    r.set_default(Role::ProfileHandler, SingleProfileHandler::TYPE);
    assert_eq!(
        build(&r).unwrap_err().to_string(),
        "f.yaml:1:1: plugins: no profile handler is declared and the default one cannot be \
         built: unknown plugin type \"single-profile-handler\""
    );
    let r = {
        let mut r = registry();
        r.set_default(Role::Picker, "nothing-here");
        r
    };
    assert!(build(&r).unwrap_err().to_string().starts_with(
        "f.yaml:0:0: schedulingProfiles[0]: the profile has no picker and the default one \
             cannot be built: unknown plugin type \"nothing-here\""
    ));
    let bare = {
        let mut r = Registry::new();
        r.register("s", |spec| {
            Ok(Arc::new(Test {
                name: spec.name.clone(),
                kind: "s",
            }))
        });
        r
    };
    assert_eq!(
        build(&bare).unwrap_err().to_string(),
        "f.yaml:1:1: plugins: no profile handler is declared and the default one cannot be \
         built: no default profile handler is registered"
    );
    let mut handler_only = bare.clone();
    handler_only.register(SingleProfileHandler::TYPE, |spec| {
        Ok(Arc::new(SingleProfileHandler::new(spec.name.clone())))
    });
    handler_only.set_default(Role::ProfileHandler, SingleProfileHandler::TYPE);
    assert_eq!(
        build(&handler_only).unwrap_err().to_string(),
        "f.yaml:0:0: schedulingProfiles[0]: the profile has no picker and the default one \
         cannot be built: no default picker is registered"
    );
    // Optional roles without a default are left out: no detector, parser or
    // data layer sources.
    let y = build(&registry()).unwrap();
    assert!(!y.contains("saturationDetector"), "{y}");
    assert!(!y.contains("parser"), "{y}");
    assert!(y.contains("dataLayer:\n  sources: []"), "{y}");
}

#[test]
fn objectives_and_model_rewrites_are_validated_with_locations() {
    let text = "objectives:\n- {name: batch, priority: -1}\n- name: live\n  priority: 5\nmodelRewrites:\n- name: canary\n  rules:\n  - matches:\n    - model: {type: Exact, value: chat}\n    targets:\n    - {modelRewrite: chat-v1, weight: 3}\n    - {modelRewrite: chat-v2, weight: 1}\n";
    let built = EndpointPickerConfig::parse(text, "f")
        .unwrap()
        .build(&registry())
        .unwrap();
    assert_eq!(built.objectives["batch"], -1);
    assert_eq!(built.objectives["live"], 5);
    assert!(!built.model_rewrites.is_empty());
    let y = &built.effective_yaml;
    assert!(y.contains("modelRewrite: chat-v1"), "{y}");
    assert!(y.contains("name: batch"), "{y}");

    let cases: &[(&str, &str)] = &[
        (
            "objectives:\n- {name: a}\n- {name: a}\n",
            "f.yaml:3:4: objectives[1].name: duplicate objective \"a\"",
        ),
        (
            "objectives:\n- {name: a, priorty: 1}\n",
            "f.yaml:2:13: objectives[0]: unknown field `priorty`",
        ),
        (
            "modelRewrites:\n- rules:\n  - matches:\n    - model: {type: Regex, value: x}\n    targets: [{modelRewrite: a}]\n",
            "f.yaml:4:15: modelRewrites[0].rules[0].matches[0].model.type: unsupported match type \"Regex\"",
        ),
        (
            "modelRewrites:\n- rules:\n  - targets:\n    - {modelRewrite: a, weight: 2}\n    - {modelRewrite: b}\n",
            "f.yaml:3:5: modelRewrites[0].rules[0].targets: set a weight on every target",
        ),
        (
            "modelRewrites:\n- rules:\n  - targets: [{modelRewrite: a, weight: -2}]\n",
            "f.yaml:3:",
        ),
        (
            "modelRewrites:\n- rules:\n  - targets: [{modelRewrite: a, wieght: 2}]\n",
            "f.yaml:3:",
        ),
    ];
    for (text, want) in cases {
        let got = error(text);
        assert!(
            got.starts_with(want),
            "for\n{text}\ngot:  {got}\nwant: {want}"
        );
    }
    assert!(
        error("modelRewrites:\n- rules:\n  - targets: [{modelRewrite: a, wieght: 2}]\n")
            .contains("unknown field `wieght`")
    );
}

#[test]
fn feature_gates_take_llm_ds_name_equals_bool_form() {
    let gates = |text: &str| {
        EndpointPickerConfig::parse(text, "f")
            .unwrap()
            .build(&registry())
            .map(|b| (b.feature_gates, b.flow_settings.is_some()))
    };
    let (on, flow) = gates("featureGates: [flowControl=false, dataLayer]\n").unwrap();
    assert_eq!(on, vec!["dataLayer".to_owned()]);
    assert!(!flow, "flowControl=false turns flow control off");
    let (on, _) =
        gates("featureGates: [dataLayer=false, dataLayer=TRUE, prepareDataPlugins=0]\n").unwrap();
    assert_eq!(on, vec!["dataLayer".to_owned()], "the last entry wins");
    assert!(
        error("featureGates: [flowControl=maybe]\n").starts_with(
            "f.yaml:1:16: featureGates[0]: \"maybe\" is not a value for feature gate \"flowControl\""
        ),
        "{}",
        error("featureGates: [flowControl=maybe]\n")
    );
    assert!(
        error("featureGates: [flowControll=false]\n")
            .contains("unknown feature gate \"flowControll\"")
    );
}

#[test]
fn llm_ds_data_layer_keys_are_checked_and_misspellings_still_fail() {
    let ok = "plugins:\n- type: syncer\n- type: peers\ndataLayer:\n  injectDefaults: false\n  \
              peerDiscovery: {pluginRef: peers}\n  crossReplicaSyncerPluginRef: syncer\n  \
              crossReplicaSyncInterval: 2s\n";
    let built = EndpointPickerConfig::parse(ok, "f")
        .unwrap()
        .build(&registry())
        .unwrap();
    let replicas = built.replicas.unwrap();
    assert_eq!(replicas.syncer.plugin().name(), "syncer");
    assert_eq!(replicas.peers.unwrap().plugin().name(), "peers");
    assert_eq!(replicas.interval, std::time::Duration::from_secs(2));
    let default = "plugins:\n- type: syncer\ndataLayer:\n  crossReplicaSyncerPluginRef: syncer\n";
    let built = EndpointPickerConfig::parse(default, "f")
        .unwrap()
        .build(&registry())
        .unwrap();
    let replicas = built.replicas.unwrap();
    assert!(replicas.peers.is_none());
    assert_eq!(replicas.interval, crate::replicas::DEFAULT_SYNC_INTERVAL);
    assert!(
        error("plugins:\n- type: s\ndataLayer:\n  crossReplicaSyncerPluginRef: s\n").contains(
            "dataLayer.crossReplicaSyncerPluginRef: plugin \"s\" is not a cross-replica syncer"
        )
    );
    assert!(
        error("plugins:\n- type: s\ndataLayer:\n  peerDiscovery: {pluginRef: s}\n").contains(
            "dataLayer.peerDiscovery.pluginRef: plugin \"s\" is not a peer-discovery plugin"
        )
    );
    assert!(
        error("dataLayer:\n  crossReplicaSyncInterval: 0s\n")
            .contains("dataLayer.crossReplicaSyncInterval: \"0s\" is not a positive duration")
    );
    let dangling = "dataLayer:\n  discovery: {pluginRef: files}\n";
    assert!(
        error(dangling)
            .starts_with("f.yaml:2:15: dataLayer.discovery.pluginRef: no plugin named \"files\""),
        "{}",
        error(dangling)
    );
    assert!(
        error("plugins:\n- type: s\ndataLayer:\n  discovery: {pluginRef: s}\n").contains(
            "dataLayer.discovery.pluginRef: plugin \"s\" is not an endpoint-discovery plugin"
        )
    );
    assert!(
        error("dataLayer:\n  crossReplicaSyncerPluginRef: x\n")
            .contains("dataLayer.crossReplicaSyncerPluginRef: no plugin named \"x\"")
    );
    assert!(
        error("dataLayer:\n  crossReplicaSyncInterval: soon\n")
            .contains("dataLayer.crossReplicaSyncInterval: \"soon\" is not a positive duration")
    );
    assert!(
        error("dataLayer:\n  injectDefault: false\n")
            .starts_with("f.yaml:2:3: dataLayer: unknown field `injectDefault`"),
        "{}",
        error("dataLayer:\n  injectDefault: false\n")
    );
}
