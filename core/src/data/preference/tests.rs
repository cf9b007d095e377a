use super::*;
use crate::data::IGNORE_INDEX;

fn data(seq_len: usize, keep_end: bool, pairs: Vec<EncodedPair>) -> PreferenceData {
    let order = crate::data::text::order::EpochOrder::new(1, pairs.len());
    PreferenceData {
        seq_len,
        keep_end,
        packing: false,
        cross_talk: false,
        train: pairs,
        val: Vec::new(),
        order,
        counts: Default::default(),
        files: Vec::new(),
    }
}

fn pair(prompt: &[u32], chosen: &[u32], rejected: &[u32]) -> EncodedPair {
    EncodedPair { prompt: prompt.to_vec(), chosen: chosen.to_vec(), rejected: rejected.to_vec() }
}

fn rows(t: &Tensor) -> Vec<Vec<i64>> {
    (0..t.size()[0]).map(|i| Vec::<i64>::try_from(t.get(i)).unwrap()).collect()
}

const X: i64 = IGNORE_INDEX;

#[test]
fn a_batch_is_the_chosen_rows_then_the_rejected_ones_trained_on_their_completions_only() {
    let d = data(16, false, vec![pair(&[1, 2, 3], &[4, 5], &[6]), pair(&[7, 8], &[9], &[10, 11])]);
    let batch = d.collate(Split::Train, &[0, 1]).unwrap();
    assert_eq!(batch.samples, 2, "a sample is a pair");
    // As TRL's DataCollatorForPreference: [p+c for each pair] + [p+r for each pair],
    // right-padded; the targets are the next tokens where they are the completion's.
    assert_eq!(rows(&batch.inputs), [vec![1, 2, 3, 4], vec![7, 8, 0, 0], vec![1, 2, 3, 0], vec![7, 8, 10, 0]]);
    assert_eq!(rows(&batch.targets), [vec![X, X, 4, 5], vec![X, 9, X, X], vec![X, X, 6, X], vec![X, 10, 11, X]]);
}

#[test]
fn long_rows_keep_their_start_or_their_end_as_trls_truncation_mode() {
    let p = pair(&[1, 2, 3], &[4, 5, 6, 7], &[8]);
    // Sequences of at most 4 tokens (3 positions).
    let start = data(3, false, vec![p.clone()]).collate(Split::Train, &[0]).unwrap();
    assert_eq!(rows(&start.inputs), [vec![1, 2, 3], vec![1, 2, 3]]);
    assert_eq!(rows(&start.targets), [vec![X, X, 4], vec![X, X, 8]]);
    let end = data(3, true, vec![p]).collate(Split::Train, &[0]).unwrap();
    assert_eq!(rows(&end.inputs), [vec![4, 5, 6], vec![1, 2, 3]]);
    assert_eq!(rows(&end.targets), [vec![5, 6, 7], vec![X, X, 8]]);
}

#[test]
fn a_packed_pair_holds_its_prompt_once_and_each_answer_continues_it() {
    let d = data(16, false, vec![pair(&[1, 2, 3], &[4, 5], &[6])]);
    let batch = d.collate_packed(Split::Train, &[0]).unwrap();
    // prompt but its last token | last prompt token + chosen | last prompt token + rejected
    assert_eq!(rows(&batch.inputs), [vec![1, 2, 3, 4, 3]]);
    assert_eq!(rows(&batch.targets), [vec![X, X, 4, 5, 6]]);
    let s = batch.segments.as_ref().unwrap();
    assert_eq!(rows(&s.positions), [vec![0, 1, 2, 3, 2]], "both answers continue from the prompt's end");
    assert_eq!(rows(&s.ids), [vec![1, 1, 2, 2, 3]]);
    assert_eq!(rows(s.prefix.as_ref().unwrap()), [vec![1, 1, 1, 1, 1]], "each sees the prompt's row");
}

#[test]
fn the_trained_tokens_counted_are_the_targets_a_batch_trains() {
    let pairs = vec![pair(&[1, 2, 3], &[4, 5, 6, 7], &[8]), pair(&[], &[4, 5], &[6, 7, 8]), pair(&[1; 6], &[2, 3], &[4])];
    for keep_end in [false, true] {
        for seq_len in [3, 4, 16] {
            let d = data(seq_len, keep_end, pairs.clone());
            for (i, p) in pairs.iter().enumerate() {
                if !keep_end && p.prompt.len() > seq_len {
                    continue;
                }
                let targets = d.collate(Split::Train, &[i]).unwrap().targets;
                let trained = Vec::<i64>::try_from(targets.flatten(0, -1)).unwrap().iter().filter(|&&t| t != X).count();
                let counted = [&p.chosen, &p.rejected].map(|c| load::trained(p.prompt.len(), c.len(), seq_len + 1, keep_end));
                assert_eq!(counted.iter().sum::<usize>(), trained, "pair {i}, seq_len {seq_len}, keep_end {keep_end}");
            }
        }
    }
}
