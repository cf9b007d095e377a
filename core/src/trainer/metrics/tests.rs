use ptrain_plugin_api::MetricValue;

use super::*;
use crate::dist::SingleRank;

fn sources<'a>(params: &'a [(String, Tensor)]) -> Sources<'a> {
    Sources { dist: &SingleRank, params, train_len: 100, device: Device::Cpu, world: 1, unix_start: unix_now(), total_steps: 10 }
}

fn processor() -> MetricsProcessor {
    MetricsProcessor::new(0, progress::Progress::new(0, 10, false, false))
}

fn step(tally: &mut Tally, loss: f32, metrics: &[(&'static str, f64)]) {
    let metrics = metrics.iter().map(|(n, v)| (*n, Tensor::from(*v))).collect();
    tally.count_step(1, &PhaseTimes::default(), 0.0, Tensor::from(loss), metrics);
}

fn scalars(batch: &MetricBatch) -> Vec<(String, f64)> {
    batch.metrics.iter().filter_map(|m| Some((m.name.to_string(), m.as_scalar()?))).collect()
}

fn get(batch: &MetricBatch, name: &str) -> Option<f64> {
    scalars(batch).into_iter().find(|(n, _)| n == name).map(|(_, v)| v)
}

#[test]
fn a_batch_holds_the_means_since_the_last_one_of_the_loss_and_the_objectives_metrics() {
    let (mut metrics, mut tally) = (processor(), Tally::new(4, 0, 0));
    tally.step_tokens = 24;
    step(&mut tally, 1.0, &[("rewards/chosen", 0.5)]);
    step(&mut tally, 3.0, &[("rewards/chosen", 1.5)]);
    let batch = metrics.batch(2, 0.25, Needs::BASIC_METRICS, Vec::new(), &mut tally, &sources(&[])).unwrap();
    assert_eq!(batch.step, 2);
    assert_eq!(get(&batch, "train/loss"), Some(2.0));
    assert_eq!(get(&batch, "train/rewards/chosen"), Some(1.0), "divided by the steps, as the loss");
    assert_eq!(get(&batch, "train/lr"), Some(0.25));
    assert_eq!(get(&batch, "train/epoch"), Some(0.08), "8 samples of 100");
    assert_eq!(get(&batch, "train/grad_norm"), None, "detailed metrics were not asked for");
    assert_eq!(tally.tokens_this_part(), 48, "the positions the two steps computed");
    step(&mut tally, 5.0, &[]);
    let next = metrics.batch(3, 0.25, Needs::BASIC_METRICS, Vec::new(), &mut tally, &sources(&[])).unwrap();
    assert_eq!(get(&next, "train/loss"), Some(5.0), "since the last batch only");
    assert_eq!(get(&next, "train/rewards/chosen"), None);
}

#[test]
fn emitted_metrics_come_first_and_nothing_is_read_when_no_sink_wants_the_core_ones() {
    let (mut metrics, mut tally) = (processor(), Tally::default());
    step(&mut tally, 2.0, &[]);
    let point = EvalPoint { step: 1, loss: 1.5, accuracy: Some(0.75), samples: 16, metrics: vec![("accuracy", 0.75)] };
    let for_hook: Vec<String> = metrics.record_eval(&point).iter().map(|m| m.name.to_string()).collect();
    assert_eq!(for_hook, ["eval/loss", "eval/accuracy"]);
    assert!(metrics.has_emitted());
    let plugin = vec![Metric::scalar("plugin/x", 9.0)];
    let batch = metrics.batch(1, 0.1, Needs::NONE, plugin, &mut tally, &sources(&[])).unwrap();
    assert_eq!(scalars(&batch), [("plugin/x".to_string(), 9.0), ("eval/loss".into(), 1.5), ("eval/accuracy".into(), 0.75)]);
    assert!(!metrics.has_emitted(), "sent once");
    assert_eq!(tally.take_mean_loss(Since::Metrics, 1).unwrap(), 2.0, "the loss was not read");
}

#[test]
fn histograms_cover_every_parameter_and_gradient_when_asked() {
    let (mut metrics, mut tally) = (processor(), Tally::default());
    let w = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0]).set_requires_grad(true);
    (&w * &w).sum(Kind::Float).backward();
    let params = [("w".to_string(), w)];
    let batch = metrics.batch(1, 0.1, Needs::HISTOGRAMS, Vec::new(), &mut tally, &sources(&params)).unwrap();
    let histogram = |name: &str| match &batch.get(name).expect(name).value {
        MetricValue::Histogram(h) => (h.min, h.max, h.sum),
        _ => panic!("{name} is a histogram"),
    };
    assert_eq!(histogram("params/w"), (1.0, 4.0, 10.0));
    assert_eq!(histogram("grads/w"), (2.0, 8.0, 20.0), "d(w^2)/dw = 2w");
}
