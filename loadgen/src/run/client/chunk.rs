//! How a streamed chunk is read: the fast path decodes it straight into the few fields used
//! ([`Chunk`], borrowing its strings), the general path reads a [`Value`]; both yield the
//! chunk's [`Facts`].

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::Value;

/// What one streamed chunk says, however it was decoded.
pub(super) struct Facts<'a> {
    /// `usage` when it is an object: (completion, prompt, cached) tokens.
    pub(super) usage: Option<(Option<u64>, Option<u64>, Option<u64>)>,
    /// `choices[0].finish_reason`.
    pub(super) finish_reason: Option<&'a str>,
    /// `nvext.worker_id` (see [`worker_of`]).
    pub(super) worker: Option<u32>,
    /// `nvext.timing`'s `ttft_ms` and `total_time_ms` (see [`engine_ms`]).
    pub(super) engine: [Option<f64>; 2],
    /// `choices[0].text` (text completions).
    pub(super) text: Option<&'a str>,
    /// `choices[0].delta`, when present: its `content`, `reasoning_content` and `reasoning`
    /// (each `""` when absent or not a string).
    pub(super) delta: Option<[&'a str; 3]>,
    /// `choices[0].delta.tool_calls`: (index, id, function name, argument text) of each.
    pub(super) tool_calls: Vec<ToolDelta<'a>>,
}

/// One entry of `delta.tool_calls`: the call's `index` (its position when absent), `id`,
/// `function.name` and `function.arguments` (`""` when absent).
pub(super) type ToolDelta<'a> = (usize, Option<&'a str>, Option<&'a str>, &'a str);

/// A JSON object decoded as `T`. A derived struct also accepts a JSON array (its fields by
/// position), which a [`Value`] lookup by key never would; this wrapper accepts objects only,
/// so the fast path never reads a chunk the general path would read differently.
pub(super) struct Object<T>(pub(super) T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for V<T> {
            type Value = Object<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<Object<T>, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(Object)
            }
        }
        d.deserialize_map(V(std::marker::PhantomData))
    }
}

/// The first element of a JSON array (the rest are checked to be JSON and skipped), as
/// `/choices/0` reads it.
struct First<T>(Option<T>);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for First<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for V<T> {
            type Value = First<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON array")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<First<T>, A::Error> {
                let first = seq.next_element::<T>()?;
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(First(first))
            }
        }
        d.deserialize_seq(V(std::marker::PhantomData))
    }
}

/// A streamed chunk as the fast path reads it: only the fields the client uses, strings
/// borrowed from the event's text where they have no escapes.
#[derive(Deserialize)]
pub(super) struct Chunk<'a> {
    /// Any non-null `error` sends the chunk to the general path, which reads the message.
    pub(super) error: Option<serde::de::IgnoredAny>,
    usage: Option<Object<ChunkUsage>>,
    #[serde(borrow)]
    choices: Option<First<Object<ChunkChoice<'a>>>>,
    nvext: Option<Object<ChunkNvext>>,
}

#[derive(Deserialize)]
struct ChunkUsage {
    completion_tokens: Option<u64>,
    prompt_tokens: Option<u64>,
    prompt_tokens_details: Option<Object<ChunkUsageDetails>>,
}

#[derive(Deserialize)]
struct ChunkUsageDetails {
    cached_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct ChunkChoice<'a> {
    #[serde(borrow)]
    text: Option<Cow<'a, str>>,
    #[serde(borrow)]
    delta: Option<Object<ChunkDelta<'a>>>,
    #[serde(borrow)]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct ChunkDelta<'a> {
    #[serde(borrow)]
    content: Option<Cow<'a, str>>,
    #[serde(borrow)]
    reasoning_content: Option<Cow<'a, str>>,
    #[serde(borrow)]
    reasoning: Option<Cow<'a, str>>,
    #[serde(borrow)]
    tool_calls: Option<Vec<Object<ChunkToolCall<'a>>>>,
}

#[derive(Deserialize)]
struct ChunkToolCall<'a> {
    index: Option<usize>,
    #[serde(borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    function: Option<Object<ChunkFunction<'a>>>,
}

#[derive(Deserialize)]
struct ChunkFunction<'a> {
    #[serde(borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow)]
    arguments: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct ChunkNvext {
    worker_id: Option<WorkerIdField>,
    timing: Option<Object<ChunkTiming>>,
}

/// `nvext.timing`: the server's own times (ms from its engine's submission).
#[derive(Deserialize)]
struct ChunkTiming {
    ttft_ms: Option<f64>,
    total_time_ms: Option<f64>,
}

/// `nvext.worker_id`: a number, or an object of optional `decode_worker_id` and
/// `prefill_worker_id` numbers.
enum WorkerIdField {
    Id(u64),
    Pair(Object<ChunkWorkerPair>),
}

impl<'de> Deserialize<'de> for WorkerIdField {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = WorkerIdField;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a worker id or an object of worker ids")
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<WorkerIdField, E> {
                Ok(WorkerIdField::Id(n))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<WorkerIdField, A::Error> {
                ChunkWorkerPair::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(|p| WorkerIdField::Pair(Object(p)))
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Deserialize)]
struct ChunkWorkerPair {
    decode_worker_id: Option<u64>,
    prefill_worker_id: Option<u64>,
}

impl<'a> Chunk<'a> {
    /// The chunk's facts, borrowing from it (`error` is the caller's to check first).
    pub(super) fn facts(&self) -> Facts<'_> {
        let choice = self
            .choices
            .as_ref()
            .and_then(|c| c.0.as_ref())
            .map(|c| &c.0);
        let usage = self.usage.as_ref().map(|Object(u)| {
            let cached = u
                .prompt_tokens_details
                .as_ref()
                .and_then(|d| d.0.cached_tokens);
            (u.completion_tokens, u.prompt_tokens, cached)
        });
        let id = |n: Option<u64>| n.and_then(|n| u32::try_from(n).ok());
        let worker = self
            .nvext
            .as_ref()
            .and_then(|n| n.0.worker_id.as_ref())
            .and_then(|w| match w {
                WorkerIdField::Id(n) => id(Some(*n)),
                WorkerIdField::Pair(Object(p)) => {
                    id(p.decode_worker_id).or_else(|| id(p.prefill_worker_id))
                }
            });
        let engine = self
            .nvext
            .as_ref()
            .and_then(|n| n.0.timing.as_ref())
            .map_or([None, None], |Object(t)| {
                [engine_ms(t.ttft_ms), engine_ms(t.total_time_ms)]
            });
        let delta = choice.and_then(|c| c.delta.as_ref()).map(|Object(d)| d);
        let tool_calls = delta
            .and_then(|d| d.tool_calls.as_ref())
            .map(|calls| {
                calls
                    .iter()
                    .enumerate()
                    .map(|(i, Object(c))| {
                        let f = c.function.as_ref().map(|Object(f)| f);
                        (
                            c.index.unwrap_or(i),
                            c.id.as_deref(),
                            f.and_then(|f| f.name.as_deref()),
                            f.and_then(|f| f.arguments.as_deref()).unwrap_or(""),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        Facts {
            usage,
            finish_reason: choice.and_then(|c| c.finish_reason.as_deref()),
            worker,
            engine,
            text: choice.and_then(|c| c.text.as_deref()),
            delta: delta.map(|d| {
                [
                    d.content.as_deref().unwrap_or(""),
                    d.reasoning_content.as_deref().unwrap_or(""),
                    d.reasoning.as_deref().unwrap_or(""),
                ]
            }),
            tool_calls,
        }
    }
}

/// The serving worker of a response's `nvext.worker_id`: a number, or Dynamo's object
/// `{"prefill_worker_id", "decode_worker_id"}` (the decode worker, else the prefill one).
pub(super) fn worker_of(v: &Value) -> Option<u32> {
    let id = |x: Option<&Value>| {
        x.and_then(Value::as_u64)
            .and_then(|n| u32::try_from(n).ok())
    };
    id(Some(v))
        .or_else(|| id(v.get("decode_worker_id")))
        .or_else(|| id(v.get("prefill_worker_id")))
}

/// A server time in ms when it is one: finite and not negative.
pub(super) fn engine_ms(ms: Option<f64>) -> Option<f64> {
    ms.filter(|x| x.is_finite() && *x >= 0.0)
}
