//! Where the embedded interpreter lives: its shared libpython's directory becomes the
//! plugin's run path (a pyenv or uv Python keeps it outside the loader's default
//! directories), and the interpreter pyo3 built against is the one the plugin asks for
//! its `sys.path` at run time unless `PTRAIN_PYTHON` names another.

fn main() {
    println!("cargo:rerun-if-env-changed=PYO3_PYTHON");
    let config = pyo3_build_config::get();
    if let Some(dir) = config.lib_dir() {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-rpath,{dir}");
    }
    let python = config.executable().unwrap_or("python3");
    println!("cargo:rustc-env=PTRAIN_BUILD_PYTHON={python}");
}
