//! Which requests a worker can ever run to the end: [`EngineConfig::check_request`], checked
//! once at submission, and the [`RejectReason`] of a request refused there (or, for a scheduler
//! driven directly, rejected at admission).
//!
//! The rule is that of an idle worker: a request passes when a worker running nothing else could
//! admit it and emit every one of its tokens. Every flavour admits the head of its queue on an
//! idle worker once it passes (SGLang waives its output reservation when nothing runs), so a
//! request the cluster accepts always finishes, however long it waits behind others.

use crate::request::EngineRequest;

use super::config::EngineConfig;

/// Why a request can never run to the end on this engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RejectReason {
    /// The prompt has no tokens: there is nothing to compute a first token from.
    EmptyPrompt,
    /// The request asks for no output token (every request generates at least one).
    NoOutputTokens,
    /// The prompt's block hashes do not match its length at this engine's block size (the
    /// caller hashed it at another block size).
    MalformedPrompt {
        /// Prompt tokens.
        prompt_tokens: usize,
        /// Full-block hashes supplied.
        hashed_blocks: usize,
        /// The engine's block size.
        block_size: usize,
    },
    /// The prompt does not fit the context length.
    ExceedsMaxModelLen {
        /// Prompt tokens.
        prompt_tokens: usize,
        /// The limit.
        max_model_len: usize,
    },
    /// Chunked prefill is off and the prompt is longer than one pass's token budget.
    ExceedsBatchBudget {
        /// Prompt tokens.
        prompt_tokens: usize,
        /// Tokens one pass may schedule (`max_num_batched_tokens`).
        max_num_batched_tokens: usize,
    },
    /// The request (prompt and the KV of its output) needs more blocks than a worker's pool.
    ExceedsKvCapacity {
        /// Blocks it needs by its last token.
        blocks_needed: usize,
        /// Blocks in the pool.
        num_gpu_blocks: usize,
    },
    /// An idle worker could not schedule the request although it passed the checks at
    /// submission. A scheduler defect: counted, and the request is rejected rather than left
    /// waiting forever.
    Unschedulable,
}

impl RejectReason {
    /// A stable snake_case name of the reason's kind (for grouping and machine-readable
    /// reports).
    pub fn code(&self) -> &'static str {
        match self {
            RejectReason::EmptyPrompt => "empty_prompt",
            RejectReason::NoOutputTokens => "no_output_tokens",
            RejectReason::MalformedPrompt { .. } => "malformed_prompt",
            RejectReason::ExceedsMaxModelLen { .. } => "exceeds_max_model_len",
            RejectReason::ExceedsBatchBudget { .. } => "exceeds_batch_budget",
            RejectReason::ExceedsKvCapacity { .. } => "exceeds_kv_capacity",
            RejectReason::Unschedulable => "unschedulable",
        }
    }
}

impl std::fmt::Display for RejectReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            RejectReason::EmptyPrompt => f.write_str("the prompt is empty"),
            RejectReason::NoOutputTokens => {
                f.write_str("the request asks for no output tokens (at least 1 is needed)")
            }
            RejectReason::MalformedPrompt {
                prompt_tokens,
                hashed_blocks,
                block_size,
            } => write!(
                f,
                "a prompt of {prompt_tokens} tokens has {hashed_blocks} block hashes; at block \
                 size {block_size} it needs {}",
                prompt_tokens / block_size.max(1)
            ),
            RejectReason::ExceedsMaxModelLen {
                prompt_tokens,
                max_model_len,
            } => write!(
                f,
                "prompt of {prompt_tokens} tokens does not fit the context length of {max_model_len}"
            ),
            RejectReason::ExceedsBatchBudget {
                prompt_tokens,
                max_num_batched_tokens,
            } => write!(
                f,
                "prompt of {prompt_tokens} tokens exceeds the per-pass budget of \
                 {max_num_batched_tokens} tokens (--max-num-batched-tokens) and chunked prefill \
                 is off"
            ),
            RejectReason::ExceedsKvCapacity {
                blocks_needed,
                num_gpu_blocks,
            } => write!(
                f,
                "request needs {blocks_needed} KV blocks (prompt and output) but the pool has \
                 {num_gpu_blocks}"
            ),
            RejectReason::Unschedulable => {
                f.write_str("the engine could not schedule the request on an idle worker")
            }
        }
    }
}

impl EngineConfig {
    /// Checks that a worker of this configuration can run `request` to its last token: a
    /// non-empty prompt hashed at this block size, at least one output token, a prompt within
    /// `max_model_len` and (without chunked prefill, SGLang aside) within one pass's budget,
    /// and a KV pool that holds the request at its longest. That is the prompt plus all output
    /// tokens but the last (whose KV is never computed), the output cut at `max_model_len`;
    /// TRT-LLM reserves prompt plus the full output at admission, so it needs that much.
    pub(crate) fn check_request(&self, request: &EngineRequest) -> Result<(), RejectReason> {
        let prompt = &request.prompt;
        let bs = self.block_size.max(1);
        if prompt.len == 0 {
            return Err(RejectReason::EmptyPrompt);
        }
        if request.max_output_tokens == 0 {
            return Err(RejectReason::NoOutputTokens);
        }
        if prompt.blocks.len() != prompt.len / bs
            || prompt.blocks.local.len() != prompt.blocks.sequence.len()
            || prompt.tail.len() != prompt.len % bs
        {
            return Err(RejectReason::MalformedPrompt {
                prompt_tokens: prompt.len,
                hashed_blocks: prompt.blocks.len(),
                block_size: bs,
            });
        }
        let policy = self.policy();
        let mut output = request.max_output_tokens;
        if let Some(max_model_len) = self.max_model_len {
            if prompt.len >= max_model_len {
                return Err(RejectReason::ExceedsMaxModelLen {
                    prompt_tokens: prompt.len,
                    max_model_len,
                });
            }
            output = output.min(max_model_len - prompt.len);
        }
        if !self.enable_chunked_prefill
            && policy.honours_chunked_prefill_flag
            && prompt.len > self.max_num_batched_tokens
        {
            return Err(RejectReason::ExceedsBatchBudget {
                prompt_tokens: prompt.len,
                max_num_batched_tokens: self.max_num_batched_tokens,
            });
        }
        let kv_tokens = if policy.reserves_full_output {
            prompt.len.saturating_add(request.max_output_tokens)
        } else {
            prompt.len + output - 1
        };
        let blocks_needed = kv_tokens.div_ceil(bs);
        if blocks_needed > self.num_gpu_blocks {
            return Err(RejectReason::ExceedsKvCapacity {
                blocks_needed,
                num_gpu_blocks: self.num_gpu_blocks,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::Prompt;
    use crate::scheduler::EngineType;

    fn request(prompt_len: usize, out: usize) -> EngineRequest {
        let tokens: Vec<u32> = (0..prompt_len as u32).collect();
        EngineRequest {
            prompt: Prompt::from_tokens(&tokens, 4),
            max_output_tokens: out,
            output_tokens: Vec::new(),
        }
    }

    fn config(engine_type: EngineType) -> EngineConfig {
        EngineConfig {
            engine_type,
            block_size: 4,
            num_gpu_blocks: 4,
            ..EngineConfig::default()
        }
    }

    #[test]
    fn every_refusal_has_its_reason() {
        let c = config(EngineType::Vllm);
        assert_eq!(
            c.check_request(&request(0, 3)),
            Err(RejectReason::EmptyPrompt)
        );
        assert_eq!(
            c.check_request(&request(3, 0)),
            Err(RejectReason::NoOutputTokens)
        );
        // 16 tokens of KV fit the 4 blocks: a 10-token prompt may generate 7 tokens.
        assert_eq!(c.check_request(&request(10, 7)), Ok(()));
        assert_eq!(
            c.check_request(&request(10, 8)),
            Err(RejectReason::ExceedsKvCapacity {
                blocks_needed: 5,
                num_gpu_blocks: 4
            })
        );
        let mut malformed = request(9, 1);
        malformed.prompt.tail.push(1);
        assert!(matches!(
            c.check_request(&malformed),
            Err(RejectReason::MalformedPrompt { .. })
        ));
    }

    #[test]
    fn context_length_cuts_the_output_it_charges() {
        let c = EngineConfig {
            max_model_len: Some(12),
            ..config(EngineType::Vllm)
        };
        assert_eq!(
            c.check_request(&request(12, 1)),
            Err(RejectReason::ExceedsMaxModelLen {
                prompt_tokens: 12,
                max_model_len: 12
            })
        );
        // The output stops at the context length: 11 tokens of KV at most.
        assert_eq!(c.check_request(&request(10, 1_000_000)), Ok(()));
    }

    #[test]
    fn trtllm_reserves_the_full_output_and_no_chunking_bounds_the_prompt() {
        let c = config(EngineType::Trtllm);
        assert_eq!(c.check_request(&request(10, 6)), Ok(()));
        assert!(c.check_request(&request(10, 7)).is_err());
        let c = EngineConfig {
            enable_chunked_prefill: false,
            max_num_batched_tokens: 8,
            ..config(EngineType::Vllm)
        };
        assert_eq!(c.check_request(&request(8, 1)), Ok(()));
        assert_eq!(
            c.check_request(&request(9, 1)),
            Err(RejectReason::ExceedsBatchBudget {
                prompt_tokens: 9,
                max_num_batched_tokens: 8
            })
        );
        // SGLang chunks by its own size whatever the flag says.
        let c = EngineConfig {
            engine_type: EngineType::Sglang,
            ..c
        };
        assert_eq!(c.check_request(&request(9, 1)), Ok(()));
    }
}
