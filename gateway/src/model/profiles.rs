//! Model profiles: the model endpoints coding tasks may use, configured by the operator.
//!
//! A profile is a name, the base URL of an OpenAI-compatible chat-completions API, a model
//! id and, when the endpoint needs one, its API key (read from a file: a mounted Secret). A
//! task names a profile (or gets the default); the key never leaves the gateway. The file:
//!
//! ```yaml
//! default: openai                 # optional; with one profile, that one
//! profiles:
//!   - name: openai
//!     baseUrl: https://api.openai.com/v1
//!     model: gpt-4.1
//!     apiKeyFile: /etc/toolyard/model-keys/openai/key
//!   - name: local
//!     baseUrl: http://vllm.models.svc:8000/v1
//!     model: qwen2.5-coder
//! ```
//!
//! In the embedded mode `TOOLYARD_MODEL_BASE_URL`, `TOOLYARD_MODEL` and
//! `TOOLYARD_MODEL_API_KEY` define one profile, `default`, instead.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// One model profile. Its key is never shown (`Debug` hides it).
#[derive(Clone)]
pub struct ModelProfile {
    /// Name tasks use.
    pub name: String,
    /// Base URL, e.g. `https://api.openai.com/v1` (no trailing slash).
    pub base_url: String,
    /// Model id sent to the endpoint.
    pub model: String,
    api_key: Option<String>,
}

impl std::fmt::Debug for ModelProfile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelProfile")
            .field("name", &self.name)
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "<set>"))
            .finish()
    }
}

impl ModelProfile {
    /// A profile; `api_key` empty or `None`: the endpoint gets no `Authorization` header.
    pub fn new(name: &str, base_url: &str, model: &str, api_key: Option<String>) -> Result<Self, String> {
        if !valid_name(name) {
            return Err(format!(
                "profile name {name:?} must be a lowercase name of letters, digits and '-' (at most 63)"
            ));
        }
        if !(base_url.starts_with("http://") || base_url.starts_with("https://"))
            || base_url.contains(char::is_whitespace)
        {
            return Err(format!("baseUrl {base_url:?} must be an http(s) URL, e.g. https://api.openai.com/v1"));
        }
        if model.trim().is_empty() || model.len() > 256 {
            return Err("model must be a model id (1 to 256 characters)".into());
        }
        Ok(Self {
            name: name.to_owned(),
            base_url: base_url.trim_end_matches('/').to_owned(),
            model: model.to_owned(),
            api_key: api_key.map(|k| k.trim().to_owned()).filter(|k| !k.is_empty()),
        })
    }

    /// The key to send to the endpoint, if any.
    pub fn api_key(&self) -> Option<&str> {
        self.api_key.as_deref()
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// Every profile of the gateway and the default one.
#[derive(Clone, Debug, Default)]
pub struct ModelProfiles {
    profiles: BTreeMap<String, ModelProfile>,
    default: Option<String>,
}

/// Why a task cannot have the profile it asks for.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProfileError {
    /// The gateway has no profile at all.
    #[error(
        "coding tasks need a model, and this gateway has no model profile: the operator sets them (chart value \
         model.profiles, or --model-profiles; in the local mode TOOLYARD_MODEL_BASE_URL and TOOLYARD_MODEL)"
    )]
    NoProfiles,
    /// Profiles exist, but none is the default and the task named none.
    #[error("name a model profile ({0}): this gateway has no default")]
    NoDefault(String),
    /// No profile of that name.
    #[error("there is no model profile {0:?} (profiles: {1})")]
    Unknown(String, String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProfiles {
    #[serde(default)]
    default: Option<String>,
    profiles: Vec<RawProfile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawProfile {
    name: String,
    base_url: String,
    model: String,
    #[serde(default)]
    api_key_file: Option<PathBuf>,
}

impl ModelProfiles {
    /// No profiles: coding tasks are refused with what to configure.
    pub fn none() -> Self {
        Self::default()
    }

    /// The given profiles; `default` must be one of them (with one profile and no default,
    /// that one is the default).
    pub fn new(profiles: Vec<ModelProfile>, default: Option<String>) -> Result<Self, String> {
        let mut map = BTreeMap::new();
        for p in profiles {
            let name = p.name.clone();
            if map.insert(name.clone(), p).is_some() {
                return Err(format!("model profile {name:?} is defined twice"));
            }
        }
        let default = match default {
            Some(d) if !map.contains_key(&d) => {
                return Err(format!("the default model profile {d:?} is not among the profiles"));
            }
            Some(d) => Some(d),
            None if map.len() == 1 => map.keys().next().cloned(),
            None => None,
        };
        Ok(Self { profiles: map, default })
    }

    /// Reads a profiles file (see the module docs); errors name the file and the field.
    pub fn from_file(path: &Path) -> anyhow::Result<Self> {
        let origin = path.display();
        let text =
            std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("reading model profiles {origin}: {e}"))?;
        let raw: RawProfiles =
            serde_saphyr::from_str(&text).map_err(|e| anyhow::anyhow!("model profiles {origin}: {e}"))?;
        let mut profiles = Vec::new();
        for (i, p) in raw.profiles.into_iter().enumerate() {
            let key = match &p.api_key_file {
                Some(file) => Some(std::fs::read_to_string(file).map_err(|e| {
                    anyhow::anyhow!("model profiles {origin}: profiles[{i}].apiKeyFile {}: {e}", file.display())
                })?),
                None => None,
            };
            let profile = ModelProfile::new(&p.name, &p.base_url, &p.model, key)
                .map_err(|e| anyhow::anyhow!("model profiles {origin}: profiles[{i}]: {e}"))?;
            profiles.push(profile);
        }
        Self::new(profiles, raw.default).map_err(|e| anyhow::anyhow!("model profiles {origin}: {e}"))
    }

    /// The embedded mode's one profile, `default`, from a base URL, model id and key; `None`
    /// when neither URL nor model is set. Errors name the variable to fix.
    pub fn from_env_values(
        base_url: Option<String>,
        model: Option<String>,
        api_key: Option<String>,
    ) -> Result<Option<Self>, String> {
        match (base_url, model) {
            (None, None) => Ok(None),
            (Some(base_url), Some(model)) => {
                let profile = ModelProfile::new("default", &base_url, &model, api_key)
                    .map_err(|e| format!("TOOLYARD_MODEL_BASE_URL / TOOLYARD_MODEL: {e}"))?;
                Self::new(vec![profile], None).map(Some)
            }
            (None, Some(_)) => Err("TOOLYARD_MODEL is set but TOOLYARD_MODEL_BASE_URL is not: set both".into()),
            (Some(_), None) => Err("TOOLYARD_MODEL_BASE_URL is set but TOOLYARD_MODEL is not: set both".into()),
        }
    }

    /// True when no profile is configured.
    pub fn is_empty(&self) -> bool {
        self.profiles.is_empty()
    }

    /// Profile names, sorted.
    pub fn names(&self) -> Vec<&str> {
        self.profiles.keys().map(String::as_str).collect()
    }

    /// The profile a task gets: `requested`, else the default.
    pub fn resolve(&self, requested: Option<&str>) -> Result<&ModelProfile, ProfileError> {
        if self.profiles.is_empty() {
            return Err(ProfileError::NoProfiles);
        }
        let name = match (requested, &self.default) {
            (Some(name), _) => name,
            (None, Some(default)) => default.as_str(),
            (None, None) => return Err(ProfileError::NoDefault(self.names().join(", "))),
        };
        self.profiles.get(name).ok_or_else(|| ProfileError::Unknown(name.to_owned(), self.names().join(", ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_profile_is_the_default_and_keys_never_show() {
        let p =
            ModelProfile::new("openai", "https://api.openai.com/v1/", "gpt-4.1", Some("sk-secret\n".into())).unwrap();
        assert_eq!(p.base_url, "https://api.openai.com/v1");
        assert_eq!(p.api_key(), Some("sk-secret"));
        assert!(!format!("{p:?}").contains("sk-secret"));
        let all = ModelProfiles::new(vec![p], None).unwrap();
        assert_eq!(all.resolve(None).unwrap().name, "openai");
        assert_eq!(all.resolve(Some("openai")).unwrap().model, "gpt-4.1");
        assert_eq!(all.resolve(Some("other")).unwrap_err(), ProfileError::Unknown("other".into(), "openai".into()));
    }

    #[test]
    fn several_profiles_need_a_default_or_a_name() {
        let a = ModelProfile::new("a", "http://a/v1", "m", None).unwrap();
        let b = ModelProfile::new("b", "http://b/v1", "m", None).unwrap();
        let all = ModelProfiles::new(vec![a.clone(), b.clone()], None).unwrap();
        assert!(matches!(all.resolve(None), Err(ProfileError::NoDefault(_))));
        assert_eq!(all.resolve(Some("b")).unwrap().base_url, "http://b/v1");
        assert!(ModelProfiles::new(vec![a.clone(), b], Some("c".into())).unwrap_err().contains("\"c\""));
        assert!(ModelProfiles::new(vec![a.clone(), a], None).unwrap_err().contains("twice"));
        assert_eq!(ModelProfiles::none().resolve(None).unwrap_err(), ProfileError::NoProfiles);
    }

    #[test]
    fn bad_profiles_are_refused_with_the_field() {
        assert!(ModelProfile::new("Upper", "http://x", "m", None).unwrap_err().contains("lowercase"));
        assert!(ModelProfile::new("ok", "ftp://x", "m", None).unwrap_err().contains("http(s)"));
        assert!(ModelProfile::new("ok", "http://x", " ", None).unwrap_err().contains("model id"));
        assert_eq!(ModelProfiles::from_env_values(None, None, None).unwrap().map(|p| p.is_empty()), None);
        assert!(
            ModelProfiles::from_env_values(Some("http://x".into()), None, None)
                .unwrap_err()
                .contains("TOOLYARD_MODEL is not")
        );
        let local =
            ModelProfiles::from_env_values(Some("http://x/v1".into()), Some("m".into()), None).unwrap().unwrap();
        assert_eq!(local.resolve(None).unwrap().name, "default");
    }

    #[test]
    fn a_profiles_file_is_read_with_its_keys_and_errors_name_the_field() {
        let dir = std::env::temp_dir().join(format!("toolyard-profiles-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = dir.join("key");
        std::fs::write(&key, "sk-from-file\n").unwrap();
        let file = dir.join("profiles.yaml");
        std::fs::write(
            &file,
            format!(
                "default: local\nprofiles:\n  - name: openai\n    baseUrl: https://api.openai.com/v1\n    model: gpt-4.1\n    \
                 apiKeyFile: {}\n  - name: local\n    baseUrl: http://vllm:8000/v1\n    model: qwen\n",
                key.display()
            ),
        )
        .unwrap();
        let all = ModelProfiles::from_file(&file).unwrap();
        assert_eq!(all.resolve(None).unwrap().name, "local");
        assert_eq!(all.resolve(Some("openai")).unwrap().api_key(), Some("sk-from-file"));
        std::fs::write(&file, "profiles:\n  - name: x\n    baseUrl: http://x\n    model: m\n    apiKey: inline\n")
            .unwrap();
        assert!(ModelProfiles::from_file(&file).unwrap_err().to_string().contains("apiKey"));
        std::fs::write(
            &file,
            "profiles:\n  - name: x\n    baseUrl: http://x\n    model: m\n    apiKeyFile: /nonexistent\n",
        )
        .unwrap();
        assert!(ModelProfiles::from_file(&file).unwrap_err().to_string().contains("profiles[0].apiKeyFile"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
