//! The LoRA adapters an endpoint serves ([`LoraRegistry`]): loaded at start (`--lora-modules`)
//! or at run time (`/v1/load_lora_adapter`), each a model name of its own whose blocks never
//! match another's.

pub use crate::config::MAX_LORA_ADAPTERS;

/// Bytes of an adapter's name (`lora_name`) at most; its path (`lora_path`) may hold
/// [`MAX_LORA_PATH_BYTES`].
pub const MAX_LORA_NAME_BYTES: usize = 256;

/// Bytes of an adapter's `lora_path` at most (Linux's `PATH_MAX`).
pub const MAX_LORA_PATH_BYTES: usize = 4096;

/// Why an adapter was not loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadRefusal {
    /// One of that name is loaded already.
    Loaded,
    /// [`MAX_LORA_ADAPTERS`] are loaded.
    Full,
}

/// A loaded LoRA adapter: served as a model name of its own; its blocks never match the base
/// model's (its prompts' block hashes are salted by [`Adapter::salt`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Adapter {
    /// vLLM's `lora_int_id`: 1, 2, ... in load order.
    pub id: u64,
    /// The served name.
    pub name: String,
    /// Where it was said to come from (never read).
    pub path: String,
}

impl Adapter {
    /// The salt of this adapter's block hashes: a hash of its name.
    pub fn salt(&self) -> u64 {
        xxhash_rust::xxh3::xxh3_64(format!("lora:{}", self.name).as_bytes())
    }
}

/// The loaded LoRA adapters. A `std` mutex: held for lookups and inserts only, never across
/// an await.
#[derive(Debug, Default)]
pub struct LoraRegistry {
    inner: std::sync::Mutex<LoraState>,
}

#[derive(Debug, Default)]
struct LoraState {
    /// By name.
    loaded: std::collections::BTreeMap<String, Adapter>,
    /// The next adapter's id.
    next_id: u64,
}

impl LoraRegistry {
    /// A registry holding `modules` (`name` or `name=path` each), ids from 1.
    pub fn new(modules: &[(String, String)]) -> LoraRegistry {
        let registry = LoraRegistry::default();
        for (name, path) in modules {
            let _ = registry.load(name, path);
        }
        registry
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LoraState> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Loads an adapter, unless one of that name is loaded already or the registry holds
    /// [`MAX_LORA_ADAPTERS`].
    pub fn load(&self, name: &str, path: &str) -> Result<(), LoadRefusal> {
        let mut state = self.lock();
        if state.loaded.contains_key(name) {
            return Err(LoadRefusal::Loaded);
        }
        if state.loaded.len() >= MAX_LORA_ADAPTERS {
            return Err(LoadRefusal::Full);
        }
        state.next_id += 1;
        let adapter = Adapter {
            id: state.next_id,
            name: name.to_string(),
            path: path.to_string(),
        };
        state.loaded.insert(name.to_string(), adapter);
        Ok(())
    }

    /// Unloads an adapter; false when none of that name is loaded.
    pub fn unload(&self, name: &str) -> bool {
        self.lock().loaded.remove(name).is_some()
    }

    /// The adapter served as `name`, if loaded.
    pub fn get(&self, name: &str) -> Option<Adapter> {
        self.lock().loaded.get(name).cloned()
    }

    /// Every loaded adapter, by name.
    pub fn all(&self) -> Vec<Adapter> {
        self.lock().loaded.values().cloned().collect()
    }
}
