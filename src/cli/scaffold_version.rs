//! `ptrain plugins new NAME --api-version X`: the crate depends on ptrain-plugin-api by
//! version, as a crate from a registry, instead of by path into this machine's checkout:
//! for an author who installed a ptrain binary and never cloned it.

use ptrain_core::Error;
use ptrain_plugin_api::API_VERSION;

/// Checks that plugins built against `requested` load into this ptrain: the same
/// 0.minor, any patch (docs/plugins.md, section 12).
pub fn check(requested: &str) -> Result<(), Error> {
    let minor = |v: &str| -> Option<(u64, u64)> {
        let mut parts = v.split('.').map(|p| p.parse::<u64>().ok());
        let parsed = (parts.next()??, parts.next()??, parts.next()??);
        parts.next().is_none().then_some((parsed.0, parsed.1))
    };
    let refuse = |message: String| Error::Plugin { name: "ptrain-plugin-api".into(), message };
    let Some(theirs) = minor(requested) else { return Err(refuse(format!("--api-version {requested}: a version such as {API_VERSION}"))) };
    if Some(theirs) != minor(API_VERSION) {
        return Err(refuse(format!(
            "--api-version {requested}: this ptrain loads only plugins built against ptrain-plugin-api {}.{}.x ({API_VERSION}); \
             ask for a version this ptrain loads, or use the ptrain of that version",
            theirs.0,
            minor(API_VERSION).map_or(0, |m| m.1)
        )));
    }
    Ok(())
}

/// `cargo_toml` with its path dependency on ptrain-plugin-api replaced by `version`.
pub fn by_version(cargo_toml: &str, version: &str) -> String {
    let mut out = String::new();
    for line in cargo_toml.lines() {
        if let Some(rest) = line.strip_prefix("ptrain-plugin-api = { path = ") {
            let features = rest.split_once(", features").map_or(String::new(), |(_, f)| format!(", features{}", f.trim_end_matches(" }")));
            out.push_str(&format!(
                "# By version, from your registry (crates.io once published; a private registry, or the\n\
                 # packaged crate meanwhile: `cargo package -p ptrain-plugin-api` in a ptrain checkout, then\n\
                 #   [patch.crates-io]\n\
                 #   ptrain-plugin-api = {{ path = \"<the unpacked ptrain-plugin-api-{version}>\" }}\n\
                 # ). Any {version} or later patch of this minor version loads into the ptrain you run.\n\
                 ptrain-plugin-api = {{ version = \"{version}\"{features} }}\n"
            ));
        } else if !line.starts_with("#   ptrain-plugin-api = { git") {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_versions_this_ptrain_loads_are_written() {
        assert!(check(API_VERSION).is_ok());
        for bad in ["0.4.0", "1.5.0", "0.5", "latest", "0.5.1.2"] {
            let same_minor = bad.split('.').take(2).eq(API_VERSION.split('.').take(2)) && bad.split('.').count() == 3;
            assert_eq!(check(bad).is_ok(), same_minor, "{bad}");
        }
    }

    #[test]
    fn the_path_dependency_becomes_a_version() {
        let manifest = "[dependencies]\n#   ptrain-plugin-api = { git = \"u\", rev = \"c\", features = [\"tch\"] }\n\
                        ptrain-plugin-api = { path = \"/p/plugin-api\", features = [\"tch\"] }\nserde = \"1\"\n";
        let out = by_version(manifest, "0.5.1");
        assert!(out.contains("\nptrain-plugin-api = { version = \"0.5.1\", features = [\"tch\"] }\n"), "{out}");
        assert!(!out.contains("/p/plugin-api") && !out.contains("git =") && out.contains("serde = \"1\""), "{out}");
        let sink = by_version("ptrain-plugin-api = { path = \"/p/plugin-api\" }\n", "0.5.1");
        assert!(sink.ends_with("ptrain-plugin-api = { version = \"0.5.1\" }\n"), "{sink}");
    }
}
