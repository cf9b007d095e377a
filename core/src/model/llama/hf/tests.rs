use super::*;

fn parse(text: &str) -> Result<LlamaArch, String> {
    let raw: Map<String, Value> = serde_json::from_str(text).unwrap();
    let model_type = raw["model_type"].as_str().unwrap().to_string();
    LlamaArch::from_json(&raw, &model_type)
}

const QWEN2_4X: &str = r#"{"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": 300, "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 128, "rope_theta": 1000000.0, "rope_scaling": null, "tie_word_embeddings": true,
    "use_sliding_window": false, "sliding_window": 32, "torch_dtype": "bfloat16"}"#;

#[test]
fn the_4x_form_reads_top_level_rope_theta_and_qwen2_biases() {
    let arch = parse(QWEN2_4X).unwrap();
    let a = &arch.args;
    assert_eq!((a.rope_theta, a.rope_scaling, a.n_kv_head, a.head_dim), (1e6, RopeScaling::None, 2, 16));
    assert_eq!((a.qkv_bias, a.o_bias, a.mlp_bias, a.qk_norm, a.tie_embeddings), (true, false, false, false, true));
}

#[test]
fn the_5x_form_reads_rope_parameters_with_llama3_scaling() {
    let arch = parse(
        r#"{"model_type": "llama", "vocab_size": 300, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "max_position_embeddings": 128, "dtype": "float32",
        "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}"#,
    )
    .unwrap();
    let a = &arch.args;
    assert_eq!((a.rope_scaling, a.rope_theta, a.rope_original_max_positions, a.n_kv_head), (RopeScaling::Llama3, 5e5, 64, 4));
}

#[test]
fn what_the_llama_kind_cannot_compute_is_named() {
    for (edit, needle) in [
        (r#""rope_scaling": {"rope_type": "yarn", "factor": 4.0}"#, "rope scaling type \"yarn\""),
        (r#""use_sliding_window": true"#, "sliding_window = 32"),
        (r#""architectures": ["Qwen2ForSequenceClassification"]"#, "Qwen2ForSequenceClassification"),
        (r#""hidden_act": "gelu""#, "hidden_act"),
        (r#""num_key_value_heads": 3"#, "num_key_value_heads = 3"),
        (r#""partial_rotary_factor": 0.5"#, "partial_rotary_factor"),
    ] {
        // A later duplicate key wins in serde_json's map.
        let text = QWEN2_4X.trim_end().trim_end_matches('}').to_string() + ", " + edit + "}";
        let e = parse(&text).unwrap_err();
        assert!(e.contains(needle), "{edit}: {e}");
    }
}

#[test]
fn export_json_round_trips_through_both_forms() {
    let arch = parse(QWEN2_4X).unwrap();
    let json = arch.to_json(None);
    assert_eq!(json["rope_parameters"]["rope_theta"], 1e6);
    assert!(json.get("torch_dtype").is_none() && json.get("sliding_window").is_none());
    assert_eq!(parse(&serde_json::to_string(&json).unwrap()).unwrap(), arch);
    let mut m = crate::config::Config::default().model;
    m.llama = arch.args.clone();
    (m.vocab_size, m.n_embd, m.n_layer, m.n_head, m.block_size) = (300, 64, 2, 4, 128);
    assert_eq!(LlamaArch::from_model(&m).unwrap(), arch);
}

#[test]
fn a_from_scratch_model_exports_as_the_family_its_keys_fit() {
    let mut m = crate::config::Config::default().model;
    assert_eq!(LlamaArch::from_model(&m).unwrap().model_type, "llama");
    m.llama.qkv_bias = true;
    assert_eq!(LlamaArch::from_model(&m).unwrap().model_type, "qwen2");
    m.llama.qk_norm = true;
    let e = LlamaArch::from_model(&m).unwrap_err();
    assert!(e.contains("qk_norm = true"), "{e}");
}

#[test]
fn the_llama_table_matches_the_model_that_ptrain_builds() {
    for (tie, qkv_bias, qk_norm) in [(false, false, false), (true, true, false), (true, false, true)] {
        let mut m = crate::config::Config::default().model;
        (m.kind, m.n_layer, m.llama.n_kv_head, m.llama.tie_embeddings, m.llama.qkv_bias, m.llama.qk_norm) =
            (crate::config::ModelKind::Llama, 2, 2, tie, qkv_bias, qk_norm);
        let vs = tch::nn::VarStore::new(tch::Device::Cpu);
        let _llama = crate::model::Llama::decoder(&vs.root(), &m, crate::model::lora::Targets::NONE);
        let mut built: Vec<(String, Vec<i64>)> = vs.variables().into_iter().map(|(n, t)| (n, t.size())).collect();
        built.sort();
        let mut table: Vec<(String, Vec<i64>)> = params(&m).into_iter().map(|p| (p.name, p.shape)).collect();
        table.sort();
        assert_eq!(built, table, "tie {tie}, qkv_bias {qkv_bias}, qk_norm {qk_norm}");
    }
}
