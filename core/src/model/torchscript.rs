//! A TorchScript module exported from Python, trained in place: its parameters are
//! registered in the trainer's `VarStore` and handed to the optimizer.
//!
//! Export (Python):
//! ```python
//! scripted = torch.jit.script(MyModule())
//! scripted.save("model.pt")
//! ```

use std::path::Path;

use tch::{nn, TrainableCModule};

use super::{family::FamilySpec, Model, ModelInput, ModelOutput, Task};
use crate::{
    config::{Config, ModelKind, TaskKind},
    data::Dataset,
    error::{Error, Result},
};

/// The `torchscript` kind, registered in `model::family`.
pub const SPEC: FamilySpec = FamilySpec::without_blocks(ModelKind::Torchscript, build);

/// `model.torchscript.path`, trained for its task.
fn build(config: &Config, vs: &nn::Path, _dataset: &dyn Dataset) -> Result<Box<dyn Model>> {
    let args = &config.model.torchscript;
    let task = match args.task {
        TaskKind::Classification => Task::Classification,
        TaskKind::LanguageModel => Task::LanguageModel,
    };
    Ok(Box::new(TorchScript::load(Path::new(&args.path), vs, task)?))
}

pub struct TorchScript {
    module: TrainableCModule,
    task: Task,
    training: bool,
}

// SAFETY: the module is only used from the training thread that owns the trainer.
unsafe impl Send for TorchScript {}

impl TorchScript {
    pub fn load(path: &Path, vs: &nn::Path, task: Task) -> Result<TorchScript> {
        if !path.exists() {
            return Err(Error::MissingFile { what: "TorchScript module", path: path.to_owned() });
        }
        let mut module = TrainableCModule::load(path, vs.clone()).map_err(|e| Error::Data {
            path: path.to_owned(),
            message: format!("not a loadable TorchScript module: {}", e.to_string().lines().next().unwrap_or_default()),
        })?;
        module.set_train();
        Ok(TorchScript { module, task, training: true })
    }
}

/// A TorchScript error carries the whole interpreter traceback; its first lines
/// (and the exception's own line, the last non-empty one) say what happened.
fn first_lines(message: &str) -> String {
    let lines: Vec<&str> = message.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    match (lines.first(), lines.last()) {
        (Some(first), Some(last)) if first != last => format!("{first} ... {last}"),
        (Some(first), _) => first.to_string(),
        _ => message.to_string(),
    }
}

impl Model for TorchScript {
    /// A Python exception inside the module (`raise`) comes back as an error.
    fn forward(&mut self, input: ModelInput) -> Result<ModelOutput> {
        let train = input.train;
        if train != self.training {
            if train {
                self.module.set_train()
            } else {
                self.module.set_eval()
            }
            self.training = train;
        }
        let logits =
            self.module.forward_ts(&[input.tokens]).map_err(|e| Error::Other(format!("TorchScript forward: {}", first_lines(&e.to_string()))))?;
        Ok(ModelOutput::Logits(logits))
    }

    fn task(&self) -> Task {
        self.task
    }

    fn kind(&self) -> &str {
        "torchscript"
    }
}
