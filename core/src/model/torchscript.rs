//! A TorchScript module exported from Python, trained in place: its parameters are
//! registered in the trainer's `VarStore` and handed to the optimizer.
//!
//! Export (Python):
//! ```python
//! scripted = torch.jit.script(MyModule())
//! scripted.save("model.pt")
//! ```

use std::path::Path;

use tch::{nn, Tensor, TrainableCModule};

use super::{Model, Task};
use crate::error::{Error, Result};

pub struct TorchScript {
    module: TrainableCModule,
    task: Task,
    training: bool,
}

// The module is only used from the training thread that owns the trainer.
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

impl Model for TorchScript {
    fn forward(&mut self, inputs: &Tensor, train: bool) -> Tensor {
        if train != self.training {
            if train {
                self.module.set_train()
            } else {
                self.module.set_eval()
            }
            self.training = train;
        }
        self.module.forward_ts(&[inputs]).expect("TorchScript forward")
    }

    fn task(&self) -> Task {
        self.task
    }

    fn kind(&self) -> &str {
        "torchscript"
    }
}
