//! `export_plugin!`: the root module of a plugin library, written out by hand so
//! plugin crates need no direct abi_stable dependency (its attribute macro names
//! `::abi_stable` paths).

/// The symbol abi_stable looks up in a library; pinned by a test to abi_stable's own.
#[doc(hidden)]
pub const ROOT_MODULE_LOADER_SYMBOL: &str = "_1as_0lib_1header_0root_bmodule_bloader";

#[doc(hidden)]
pub mod __private {
    use abi_stable::{
        prefix_type::WithMetadata,
        sabi_trait::TD_Opaque,
        std_types::{RBox, RResult, RStr, RString},
    };

    use crate::{
        abi::{FfiPlugin_TO, PluginBox, PluginMod, PluginModRef},
        attachment::Descriptor,
        error::PluginError,
        host::HostApi,
        plugin::{guard, with_options_of, Adapter, Plugin},
    };

    pub extern "C" fn descriptor<P: Plugin>() -> RResult<Descriptor, RString> {
        guard(|| Ok(P::DESCRIPTOR))
    }

    pub extern "C" fn create<P: Plugin>(options: RStr<'_>, host: HostApi) -> RResult<PluginBox, RString> {
        guard(|| {
            let options = serde_json::from_str(options.as_str()).map_err(|e| PluginError::msg(format!("options are not JSON: {e}")))?;
            let plugin = with_options_of(P::DESCRIPTOR.name.as_str(), || P::new(options, host))?;
            Ok(FfiPlugin_TO::from_value(Adapter(plugin), TD_Opaque))
        })
    }

    pub fn root_module<P: Plugin>() -> PluginModRef {
        let module = PluginMod { descriptor: descriptor::<P>, create: create::<P> };
        // Leaked once per process: libraries are never unloaded.
        let leaked: &'static WithMetadata<PluginMod> = Box::leak(Box::new(WithMetadata::new(module)));
        PluginModRef(leaked.static_as_prefix())
    }

    pub use abi_stable::library::{__call_root_module_loader, CheckTypeLayout, IntoRootModuleResult, LibHeader, RootModuleResult};

    #[allow(unused)]
    fn _assert_box_type(b: PluginBox) -> FfiPlugin_TO<'static, RBox<()>> {
        b
    }
}

/// Exports a [`crate::Plugin`] implementation as the library's root module.
///
/// ```ignore
/// struct Hello;
/// impl ptrain_plugin_api::Plugin for Hello { /* ... */ }
/// ptrain_plugin_api::export_plugin!(Hello);
/// ```
#[macro_export]
macro_rules! export_plugin {
    ($plugin:ty) => {
        #[no_mangle]
        pub static _1as_0lib_1header_0root_bmodule_bloader: $crate::export::__private::LibHeader = {
            extern "C" fn __ptrain_erased_root_module() -> $crate::export::__private::RootModuleResult {
                $crate::export::__private::__call_root_module_loader(|| $crate::export::__private::root_module::<$plugin>())
            }
            unsafe {
                $crate::export::__private::LibHeader::from_constructor::<$crate::PluginModRef>(
                    __ptrain_erased_root_module,
                    $crate::export::__private::CheckTypeLayout::Yes,
                )
            }
        };
    };
}

#[cfg(test)]
mod tests {
    #[test]
    fn loader_symbol_matches_abi_stable() {
        assert_eq!(super::ROOT_MODULE_LOADER_SYMBOL, abi_stable::library::ROOT_MODULE_LOADER_NAME);
    }
}
