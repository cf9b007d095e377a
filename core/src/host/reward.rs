//! Reward plugins' calls (`[[grpo.rewards]] kind = "plugin"`): the rollout stage hands
//! a sampled micro-batch to the plugin's worker queue ([`RewardClient::submit`]) and
//! later waits, bounded, on the answer's channel; the worker thread calls the plugin's
//! `score` between its other events, in order, and answers on that channel.

use std::sync::{
    mpsc::{channel, Receiver, Sender},
    Arc, Mutex,
};

use ptrain_plugin_api::OwnedRewardBatch;

use super::{
    event::{Event, Queued, Reply},
    queue::BoundedQueue,
    runner::Runner,
    worker::WorkerFailure,
    PluginHost,
};

/// What a reward plugin answered for one micro-batch: a score per completion (NaN:
/// none), or why there is none.
pub type Scores = Result<Vec<f64>, String>;

/// One micro-batch to score, on its way to a reward plugin's worker thread.
pub struct RewardRequest {
    pub batch: OwnedRewardBatch,
    /// Taken by the first answer; dropped unanswered when the request is (the worker
    /// given up on): the waiting side then sees the channel closed.
    reply: Mutex<Option<Sender<Scores>>>,
}

impl RewardRequest {
    /// Sends the answer to whoever submitted the request (once).
    pub(super) fn answer(&self, scores: Scores) {
        if let Some(reply) = self.reply.lock().expect("reward reply lock").take() {
            // The submitter may have stopped waiting (its timeout): nothing to do.
            let _ = reply.send(scores);
        }
    }
}

/// The training thread's end of one reward plugin.
pub struct RewardClient {
    queue: Arc<BoundedQueue<Queued>>,
}

impl RewardClient {
    /// Queues `batch` for the plugin's worker thread (never blocks: a reward request
    /// is never dropped from a full queue) and returns where its answer will come.
    pub fn submit(&self, batch: OwnedRewardBatch) -> Receiver<Scores> {
        let (reply, answer) = channel();
        let request = Arc::new(RewardRequest { batch, reply: Mutex::new(Some(reply)) });
        // A closed queue (the worker gone) drops the request: the channel closes.
        self.queue.push(Queued(Event::Reward(request)));
        answer
    }
}

impl PluginHost {
    /// The reward plugin `name` (its name or library path: a loaded worker plugin whose
    /// descriptor says `.reward()`), or why it is none: a configuration mistake.
    pub fn reward_client(&self, name: &str) -> Result<RewardClient, String> {
        // By name, or by the path `--plugins` takes too.
        let path = std::path::Path::new(name).canonicalize().ok();
        let Some(instance) = self.instances.iter().find(|i| i.info.name == name || path.as_ref() == Some(&i.info.path)) else {
            return Err(format!("the plugin `{name}` is not loaded"));
        };
        if !instance.info.reward {
            return Err(format!(
                "the plugin `{name}` scores no rewards (its descriptor has no `.reward()`; `ptrain plugins new NAME --reward` writes one that has)"
            ));
        }
        match &instance.runner {
            Runner::Worker(worker) => Ok(RewardClient { queue: worker.queue.clone() }),
            _ if instance.info.threading == "inline" => {
                Err(format!("the plugin `{name}` runs inline: a reward plugin is a worker plugin (Threading::Worker), scored on its own thread"))
            }
            _ => Err(format!("the plugin `{name}` is not running on this rank")),
        }
    }
}

/// Answers a reward request with what the plugin's call returned (any other event: nothing).
pub(super) fn answer(event: &Event<'_>, result: &Result<Reply, String>) {
    if let Event::Reward(request) = event {
        request.answer(match result {
            Ok(Reply::Scores(scores)) => Ok(scores.clone()),
            Ok(_) => Err("the plugin answered no scores".into()),
            Err(error) => Err(error.clone()),
        });
    }
}

/// Answers a reward request to a plugin disabled earlier with the failure that disabled it.
pub(super) fn answer_disabled(event: &Event<'_>, failure: &Mutex<Option<WorkerFailure>>) {
    if let Event::Reward(request) = event {
        let why = match failure.lock().expect("failure lock").as_ref() {
            Some(f) => format!("the plugin was disabled after failing in {} at step {}: {}", f.hook, f.step, f.error),
            None => "the plugin was disabled after a failure".into(),
        };
        request.answer(Err(why));
    }
}
