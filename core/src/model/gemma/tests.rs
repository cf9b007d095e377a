use serde_json::{Map, Value};
use tch::{nn, Device, Kind, Tensor};

use super::{hf::GemmaArch, *};
use crate::{
    config::Config,
    model::{KvCache, Model, ModelInput, Segments},
};

/// A tiny Gemma: 4 layers alternating sliding (window 3) and full, Gemma 3's q/k norms
/// and local base with `gemma3`, Gemma 2's soft caps without.
fn shape(gemma3: bool) -> ModelConfig {
    let mut m = Config::default().model;
    (m.kind, m.n_layer, m.n_head, m.n_embd, m.block_size, m.vocab_size) = (ModelKind::Gemma, 4, 4, 32, 32, 40);
    let g = &mut m.gemma;
    (g.n_kv_head, g.head_dim, g.sliding_window, g.query_pre_attn_scalar) = (2, 12, 3, 16.0);
    (g.attn_softcap, g.final_softcap, g.qk_norm, g.rope_local_theta) = if gemma3 { (0.0, 0.0, true, 100.0) } else { (2.0, 3.0, false, 0.0) };
    m
}

/// The model with every weight drawn in name order (norms too, which start at 0).
fn drawn(m: &ModelConfig) -> (nn::VarStore, Decoder<Gemma>) {
    tch::manual_seed(3);
    let vs = nn::VarStore::new(Device::Cpu);
    let model = Gemma::decoder_with(&vs.root(), m, Targets::NONE, &mut |_| {});
    let mut vars: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    tch::no_grad(|| {
        for (_, mut t) in vars {
            t.copy_(&(Tensor::randn_like(&t) * 0.3));
        }
    });
    (vs, model)
}

fn tokens(v: &[i64]) -> Tensor {
    Tensor::from_slice(v).view([1, -1])
}

fn logits(model: &mut dyn Model, input: ModelInput) -> Tensor {
    model.forward(input).unwrap().logits().unwrap()
}

fn off(a: &Tensor, b: &Tensor) -> f64 {
    (a - b).abs().max().double_value(&[])
}

#[test]
fn the_table_matches_the_model_that_ptrain_builds() {
    for gemma3 in [false, true] {
        let m = shape(gemma3);
        let vs = nn::VarStore::new(Device::Cpu);
        let _gemma = Gemma::decoder_with(&vs.root(), &m, Targets::NONE, &mut |_| {});
        let mut built: Vec<(String, Vec<i64>)> = vs.variables().into_iter().map(|(n, t)| (n, t.size())).collect();
        built.sort();
        let mut table: Vec<(String, Vec<i64>)> = (SPEC.hf.as_ref().unwrap().params)(&m).into_iter().map(|p| (p.name, p.shape)).collect();
        table.sort();
        assert_eq!(built, table, "gemma3 {gemma3}");
    }
}

#[test]
fn packed_rows_and_a_shared_prefix_pair_attend_within_the_window_as_each_sequence_alone() {
    for gemma3 in [false, true] {
        let (_vs, mut model) = drawn(&shape(gemma3));
        let (prompt, chosen, rejected) = ([3i64, 7, 1, 12, 30], [9i64, 4, 22, 6], [5i64, 2, 8, 17, 11]);
        let packed: Vec<i64> = prompt.iter().chain(&chosen).chain(&rejected).copied().collect();
        let positions = tokens(&[0, 1, 2, 3, 4, 5, 6, 7, 8, 5, 6, 7, 8, 9]);
        let segments = Segments { positions, ids: tokens(&[1, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 3]), prefix: Some(tokens(&[1; 14])) };
        let together = logits(&mut model, ModelInput::new(&tokens(&packed), false).segments(Some(&segments)));
        for (answer, at) in [(&chosen[..], 5), (&rejected[..], 9)] {
            let alone: Vec<i64> = prompt.iter().chain(answer).copied().collect();
            let alone = logits(&mut model, ModelInput::new(&tokens(&alone), false));
            let n = answer.len() as i64;
            let diff = off(&together.narrow(1, at, n), &alone.narrow(1, 5, n));
            assert!(diff < 1e-5, "gemma3 {gemma3}: the answer at {at} differs by {diff} from its sequence alone");
        }
    }
}

#[test]
fn decoding_with_the_cache_gives_the_whole_sequences_logits_past_the_window() {
    for gemma3 in [false, true] {
        let (_vs, mut model) = drawn(&shape(gemma3));
        let ids: Vec<i64> = (0..12).map(|i| (i * 7 + 3) % 40).collect();
        let whole = tch::no_grad(|| logits(&mut model, ModelInput::new(&tokens(&ids), false)));
        let mut cache: KvCache = model.new_cache(32).unwrap();
        let mut steps = vec![tch::no_grad(|| logits(&mut model, ModelInput::new(&tokens(&ids[..5]), false).cache(&mut cache)))];
        for i in 5..12 {
            steps.push(tch::no_grad(|| logits(&mut model, ModelInput::new(&tokens(&ids[i..i + 1]), false).cache(&mut cache))));
        }
        let stepped = Tensor::cat(&steps, 1);
        assert!(off(&stepped, &whole) < 1e-5, "gemma3 {gemma3}: off by {}", off(&stepped, &whole));
        // The window matters here: with one wider than the sequence (the same layers
        // and bases) the logits past position 3 differ.
        let mut wide = shape(gemma3);
        wide.gemma.sliding_window = 32;
        let (_vs, mut unwindowed) = drawn(&wide);
        let full = tch::no_grad(|| logits(&mut unwindowed, ModelInput::new(&tokens(&ids), false)));
        assert!(off(&full.narrow(1, 0, 3), &whole.narrow(1, 0, 3)) < 1e-5 && off(&full, &whole) > 1e-3, "gemma3 {gemma3}");
    }
}

#[test]
fn the_final_logits_are_capped_and_the_hidden_states_say_so() {
    let (_vs, mut model) = drawn(&shape(false));
    let out = model.forward(ModelInput::new(&tokens(&[1, 2, 3]), false).returns(crate::model::Returns::Hidden)).unwrap();
    let crate::model::ModelOutput::Hidden { states, head } = out else { panic!("hidden states") };
    assert_eq!(head.softcap, Some(3.0));
    let capped = head.logits(&states).unwrap();
    assert!(capped.abs().max().double_value(&[]) <= 3.0 && off(&capped, &states.linear::<Tensor>(&head.weight, None)) > 1e-2);
    assert_eq!(capped.kind(), Kind::Float);
}

fn json(text: &str) -> Map<String, Value> {
    serde_json::from_str(text).unwrap()
}

const GEMMA3_5X: &str = r#"{"model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"], "vocab_size": 300, "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 24,
    "max_position_embeddings": 128, "query_pre_attn_scalar": 32, "sliding_window": 8, "final_logit_softcapping": null,
    "attn_logit_softcapping": null, "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
    "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}, "dtype": "float32"}"#;

const GEMMA3_4X: &str = r#"{"model_type": "gemma3_text", "vocab_size": 300, "hidden_size": 64, "intermediate_size": 96,
    "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 24, "max_position_embeddings": 128,
    "query_pre_attn_scalar": 32, "sliding_window": 8, "sliding_window_pattern": 4, "rope_theta": 1000000.0,
    "rope_local_base_freq": 10000.0, "rope_scaling": null, "final_logit_softcapping": null, "attn_logit_softcapping": null,
    "torch_dtype": "bfloat16"}"#;

#[test]
fn both_config_forms_read_alike_and_an_export_reads_back() {
    let five = GemmaArch::from_json(&json(GEMMA3_5X), "gemma3_text").unwrap();
    assert_eq!(GemmaArch::from_json(&json(GEMMA3_4X), "gemma3_text").unwrap(), five);
    let a = &five.args;
    assert_eq!((a.rope_theta, a.rope_local_theta, a.qk_norm, a.attn_softcap, a.final_softcap), (1e6, 1e4, true, 0.0, 0.0));
    let mut m = Config::default().model;
    (m.kind, m.vocab_size, m.n_embd, m.n_layer, m.n_head, m.block_size, m.gemma) = (ModelKind::Gemma, 300, 64, 4, 4, 128, a.clone());
    let exported = GemmaArch::from_model(&m).unwrap().to_json(None);
    assert_eq!(GemmaArch::from_json(&exported, "gemma3_text").unwrap(), five);
    // Gemma 2's class defaults fill what a config leaves out: both soft caps, every other layer sliding.
    let two = GemmaArch::from_json(
        &json(
            r#"{"model_type": "gemma2", "vocab_size": 300, "hidden_size": 64, "intermediate_size": 96,
        "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 128}"#,
        ),
        "gemma2",
    )
    .unwrap();
    assert_eq!((two.args.attn_softcap, two.args.final_softcap, two.args.sliding_window), (50.0, 30.0, 4096));
    assert_eq!(two.args.layer_types, [LayerType::SlidingAttention, LayerType::FullAttention]);
}

#[test]
fn what_the_gemma_kind_cannot_compute_is_named() {
    for (edit, needle) in [
        (r#""hidden_activation": "gelu""#, "hidden_activation"),
        (r#""rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0}}"#, "rope_type = \"linear\""),
        (r#""attn_logit_softcapping": 50.0"#, "attn_logit_softcapping"),
        (r#""tie_word_embeddings": false"#, "tie_word_embeddings"),
        (r#""use_bidirectional_attention": true"#, "use_bidirectional_attention"),
        (r#""sliding_window": null"#, "sliding_window = null"),
        (r#""layer_types": ["full_attention"]"#, "layer_types"),
        (r#""architectures": ["Gemma3ForSequenceClassification"]"#, "Gemma3ForSequenceClassification"),
    ] {
        // A later duplicate key wins in serde_json's map.
        let text = GEMMA3_5X.trim_end().trim_end_matches('}').to_string() + ", " + edit + "}";
        let e = GemmaArch::from_json(&json(&text), "gemma3_text").unwrap_err();
        assert!(e.contains(needle), "{edit}: {e}");
    }
    let mut m = shape(true);
    m.gemma.hf_model_type = "gemma2".into();
    assert!(GemmaArch::from_model(&m).unwrap_err().contains("qk_norm"));
    m.gemma.layer_types = vec![LayerType::SlidingAttention];
    assert_eq!(shape_error(&m).map(|e| e.0), Some("model.gemma.layer_types"));
}
