//! The plugin's descriptor: before a module is loaded, every function it may define
//! as an attachment that is never due (what `ptrain plugins info python` shows, and
//! the names `[plugins.python.<function>]` tables may use); once the module is
//! imported, the functions it defines with the cadences it declares. The host asks
//! for the descriptor again after creating a plugin, so those are what it schedules.
//!
//! The library's root module is written out here rather than by `export_plugin!`,
//! whose descriptor is the constant one.

use std::sync::Mutex;

use ptrain_plugin_api::{
    __abi_stable::{
        prefix_type::WithMetadata,
        std_types::{RResult, RSlice, RString},
    },
    export::__private::{__call_root_module_loader, create, CheckTypeLayout, LibHeader, RootModuleResult},
    Attachment, Cadence, Descriptor, Hook, Needs, Plugin, PluginMod, PluginModRef, Threading,
};

use crate::{call::Function, python::Declared, PythonPlugin};

const DESCRIPTION: &str = "monitors, guards and sinks written in Python (plugins.python.module)";

/// The hook each scheduled function attaches to, and what it is handed.
const fn attachment(function: Function, cadence: Cadence) -> Attachment {
    let (hook, needs) = match function {
        Function::Metrics => (Hook::Metrics, Needs::BASIC_METRICS),
        Function::StepStart => (Hook::StepStart, Needs::NONE),
        Function::AfterForward => {
            (Hook::AfterForward, Needs::LOSS.union(Needs::LOGITS).union(Needs::LABELS).union(Needs::INPUTS).union(Needs::DATASET_IDS))
        }
        Function::AfterBackward => (Hook::AfterBackward, Needs::LOSS.union(Needs::PARAMS).union(Needs::GRADS)),
        Function::StepEnd => (Hook::StepEnd, Needs::NONE),
        Function::Eval => (Hook::Eval, Needs::NONE),
        Function::Checkpoint => (Hook::Checkpoint, Needs::NONE),
        Function::RunStart => (Hook::RunStart, Needs::NONE),
        Function::RunEnd => (Hook::RunEnd, Needs::NONE),
    };
    Attachment::new(function.name(), hook, cadence).needs(needs)
}

/// `on_metrics` first: the table's own cadence keys (`plugins.python.every`) are its.
const UNLOADED: [Attachment; 7] = [
    attachment(Function::Metrics, Cadence::NEVER),
    attachment(Function::StepStart, Cadence::NEVER),
    attachment(Function::AfterForward, Cadence::NEVER),
    attachment(Function::AfterBackward, Cadence::NEVER),
    attachment(Function::StepEnd, Cadence::NEVER),
    attachment(Function::Eval, Cadence::NEVER),
    attachment(Function::Checkpoint, Cadence::NEVER),
];

pub const BEFORE_LOADING: Descriptor = Descriptor::new("python", env!("CARGO_PKG_VERSION"), DESCRIPTION, Threading::Inline, &UNLOADED);

/// The descriptor once a module is loaded (one plugin per process).
static LOADED: Mutex<Option<Descriptor>> = Mutex::new(None);

/// Describes the module's functions with their cadences (kept for the process: the
/// descriptor's data must live as long as the library).
pub fn after_loading(declared: &Declared) {
    let attachments: Vec<Attachment> = declared.iter().map(|&(function, cadence)| attachment(function, cadence)).collect();
    let attachments: &'static [Attachment] = Box::leak(attachments.into_boxed_slice());
    let descriptor = Descriptor { attachments: RSlice::from_slice(attachments), ..BEFORE_LOADING };
    *LOADED.lock().unwrap_or_else(|e| e.into_inner()) = Some(descriptor);
}

extern "C" fn descriptor() -> RResult<Descriptor, RString> {
    RResult::ROk(LOADED.lock().map(|d| d.unwrap_or(PythonPlugin::DESCRIPTOR)).unwrap_or(PythonPlugin::DESCRIPTOR))
}

fn root_module() -> PluginModRef {
    let module = PluginMod { descriptor, create: create::<PythonPlugin> };
    // Leaked once per process: libraries are never unloaded.
    let leaked: &'static WithMetadata<PluginMod> = Box::leak(Box::new(WithMetadata::new(module)));
    PluginModRef(leaked.static_as_prefix())
}

extern "C" fn erased_root_module() -> RootModuleResult {
    __call_root_module_loader(root_module)
}

/// The symbol abi_stable looks up (as `export_plugin!` writes it).
#[no_mangle]
pub static _1as_0lib_1header_0root_bmodule_bloader: LibHeader =
    // SAFETY: the constructor returns this library's root module, of plugin-api's
    // `PluginModRef`, whose layout the host checks on load.
    unsafe { LibHeader::from_constructor::<PluginModRef>(erased_root_module, CheckTypeLayout::Yes) };
