//! Where the S3 settings come from: the standard AWS environment, then the shared AWS files
//! (`~/.aws/credentials` and `~/.aws/config`, or `AWS_SHARED_CREDENTIALS_FILE` and
//! `AWS_CONFIG_FILE`), for the profile `AWS_PROFILE` (else `default`). Never from minibatchd's
//! own configuration: a dataset names objects, not keys.
//!
//! | setting | environment (first found) | files (`[profile]` keys) |
//! |---|---|---|
//! | access key | `AWS_ACCESS_KEY_ID` | `aws_access_key_id` |
//! | secret key | `AWS_SECRET_ACCESS_KEY` | `aws_secret_access_key` |
//! | session token | `AWS_SESSION_TOKEN` | `aws_session_token` |
//! | region | `AWS_REGION`, `AWS_DEFAULT_REGION` | `region` |
//! | endpoint (S3-compatible servers) | `AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL`, `AWS_ENDPOINT` | `endpoint_url` |
//!
//! Every other `AWS_*` variable `object_store` knows (web identity tokens for Kubernetes service
//! accounts, container and instance credentials, `AWS_ALLOW_HTTP`, ...) is passed through. An
//! endpoint that starts with `http://` allows plain HTTP (a local S3-compatible server).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The settings that apply, and where each came from (for the log; secrets are never logged).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settings {
    /// The access key id.
    pub access_key_id: Option<String>,
    /// The secret access key.
    pub secret_access_key: Option<String>,
    /// The session token.
    pub session_token: Option<String>,
    /// The region.
    pub region: Option<String>,
    /// A custom endpoint.
    pub endpoint: Option<String>,
    /// The profile read from the files, if any.
    pub profile: Option<String>,
}

impl Settings {
    /// Whether plain HTTP must be allowed (the endpoint says `http://`).
    #[must_use]
    pub fn allow_http(&self) -> bool {
        self.endpoint.as_deref().is_some_and(|e| e.starts_with("http://"))
    }

    /// Resolves the settings from `env` (a variable's value by name) and the user's home
    /// directory `home`.
    pub fn resolve(env: &dyn Fn(&str) -> Option<String>, home: Option<&Path>) -> Self {
        let first = |names: &[&str]| names.iter().find_map(|n| env(n).filter(|v| !v.is_empty()));
        let profile = first(&["AWS_PROFILE"]).unwrap_or_else(|| "default".to_owned());
        let credentials_file = first(&["AWS_SHARED_CREDENTIALS_FILE"])
            .map(PathBuf::from)
            .or_else(|| home.map(|h| h.join(".aws/credentials")));
        let config_file =
            first(&["AWS_CONFIG_FILE"]).map(PathBuf::from).or_else(|| home.map(|h| h.join(".aws/config")));
        let credentials = credentials_file.and_then(|p| read_ini(&p)).and_then(|mut ini| ini.remove(&profile));
        // In the config file a profile other than `default` is written `[profile NAME]`.
        let config = config_file.and_then(|p| read_ini(&p)).and_then(|mut ini| {
            ini.remove(&format!("profile {profile}")).or_else(|| {
                if profile == "default" {
                    ini.remove("default")
                } else {
                    None
                }
            })
        });
        let from_files = |key: &str| {
            credentials.as_ref().and_then(|c| c.get(key)).or_else(|| config.as_ref().and_then(|c| c.get(key))).cloned()
        };
        let used_files = credentials.is_some() || config.is_some();
        Self {
            access_key_id: first(&["AWS_ACCESS_KEY_ID"]).or_else(|| from_files("aws_access_key_id")),
            secret_access_key: first(&["AWS_SECRET_ACCESS_KEY"]).or_else(|| from_files("aws_secret_access_key")),
            session_token: first(&["AWS_SESSION_TOKEN"]).or_else(|| from_files("aws_session_token")),
            region: first(&["AWS_REGION", "AWS_DEFAULT_REGION"]).or_else(|| from_files("region")),
            endpoint: first(&["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT"])
                .or_else(|| from_files("endpoint_url")),
            profile: used_files.then_some(profile),
        }
    }
}

/// The sections of an INI file: `[name]` → `key = value` (keys lower-cased; comments `#`, `;`).
fn read_ini(path: &Path) -> Option<HashMap<String, HashMap<String, String>>> {
    let text = std::fs::read_to_string(path).ok()?;
    Some(parse_ini(&text))
}

fn parse_ini(text: &str) -> HashMap<String, HashMap<String, String>> {
    let mut out: HashMap<String, HashMap<String, String>> = HashMap::new();
    let mut section: Option<String> = None;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            let name = name.trim().to_owned();
            out.entry(name.clone()).or_default();
            section = Some(name);
        } else if let (Some(s), Some((k, v))) = (&section, line.split_once('=')) {
            out.entry(s.clone()).or_default().insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_wins_over_the_files_and_profiles_are_read_from_both_files() {
        let home = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(home.path().join(".aws")).expect("mkdir");
        std::fs::write(
            home.path().join(".aws/credentials"),
            "[default]\naws_access_key_id = DEF\naws_secret_access_key = defsecret\n\n[train]\naws_access_key_id=TRAIN\naws_secret_access_key = trainsecret # not a comment\n",
        )
        .expect("write");
        std::fs::write(
            home.path().join(".aws/config"),
            "[default]\nregion = eu-west-1\n[profile train]\nregion = us-east-2\nendpoint_url = http://127.0.0.1:9000\n",
        )
        .expect("write");
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| (*v).to_owned())
        };
        let s = Settings::resolve(&vars(&[]), Some(home.path()));
        assert_eq!(
            (s.access_key_id.as_deref(), s.region.as_deref(), s.endpoint.as_deref()),
            (Some("DEF"), Some("eu-west-1"), None)
        );
        let s = Settings::resolve(&vars(&[("AWS_PROFILE", "train")]), Some(home.path()));
        assert_eq!(
            (s.access_key_id.as_deref(), s.region.as_deref(), s.endpoint.as_deref(), s.profile.as_deref()),
            (Some("TRAIN"), Some("us-east-2"), Some("http://127.0.0.1:9000"), Some("train"))
        );
        assert!(s.allow_http());
        let s = Settings::resolve(
            &vars(&[
                ("AWS_PROFILE", "train"),
                ("AWS_ACCESS_KEY_ID", "ENV"),
                ("AWS_ENDPOINT_URL", "https://s3.example"),
            ]),
            Some(home.path()),
        );
        assert_eq!((s.access_key_id.as_deref(), s.endpoint.as_deref()), (Some("ENV"), Some("https://s3.example")));
        assert!(!s.allow_http());
        // No files, no environment: nothing (object_store then tries instance credentials).
        let s = Settings::resolve(&vars(&[]), None);
        assert_eq!(s, Settings::default());
    }
}
