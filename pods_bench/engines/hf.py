"""Rollouts with transformers `generate`, on the trainer's own model object (CPU or GPU).

Each prompt is repeated n times and the rows are generated in left-padded batches of at most
`max_batch`. The rows of a batch that share a prompt share its prefill: the KV cache of the prompt
(but its last token) is computed once per distinct prompt and copied to each of its rows, and
generate starts from there (`prefill_shared_prompts`); a training step's n rollouts of one prompt cost
one prefill instead of n. Sampling is seeded per call inside `torch.random.fork_rng`, so a (config, seed, step)
reproduces and the trainer's own random stream is left untouched. Because the engine holds the very
model object the trainer updates, `sync_weights` has nothing to do.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

import torch

from pods_bench.engines.base import ENGINES, EngineSetup, RolloutEngine, Rollouts, SamplingConfig

# transformers is imported where it is used: loading the engines' registry (every config check)
# then costs no transformers import. TemperatureWithLogprobs is therefore not a subclass of
# transformers' LogitsProcessor, an abstract base with no behaviour: LogitsProcessorList only calls
# each processor as processor(input_ids, scores).


class TemperatureWithLogprobs:
    """Divides the logits by the sampling temperature and records the log-probability of each
    sampled token under softmax(logits / T): the policy the trainer optimises.

    Why not `output_scores` + `compute_transition_scores`: those keep every step's full
    (batch x vocab) scores until generation ends -- tens of GB for a 150k vocabulary and a thousand
    new tokens -- while this keeps a single step. Step t's call sees the token sampled at step t-1
    as the last column of `input_ids`, so it gathers that token's log-prob from the previous step.
    generate adds no temperature warper of its own (it is given temperature 1.0); top-p, if any,
    truncates after this processor, as in generate's own order.
    """

    def __init__(self, temperature: float):
        self.temperature = temperature
        self.previous: torch.Tensor | None = None  # log-softmax of the last step, (batch, vocab)
        self.sampled: list[torch.Tensor] = []  # per step: (batch,) log-probs of the sampled tokens

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.previous is not None:
            self.sampled.append(self.previous.gather(1, input_ids[:, -1:]).squeeze(1))
        scores = scores / self.temperature
        self.previous = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def logprobs(self, new_tokens: torch.LongTensor) -> torch.Tensor:
        """(batch, steps) log-probs of `new_tokens`, the generated part of generate's output."""
        steps = new_tokens.shape[1]
        sampled = self.sampled[:steps]  # generate may run one extra, undone step on some devices
        if len(sampled) < steps:
            sampled.append(self.previous.gather(1, new_tokens[:, -1:]).squeeze(1))
        return torch.stack(sampled, dim=1)


@contextmanager
def eval_mode(model):
    """No dropout while sampling; the previous train/eval mode is restored afterwards."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


@contextmanager
def neutral_generation_config(model):
    """While generating, the model's own generation_config holds nothing but its special tokens.

    transformers 5 fills every field a GenerationConfig leaves unset (None) from the model's
    generation_config: a checkpoint's repetition_penalty 1.05, top_k 20 or top_p 0.8 would shape the
    rollouts behind the config's back, and some fields (min_p, top_h, typical_p, ...) have no
    explicit "off" value other than None. So the model's one is swapped for an empty one."""
    from transformers import GenerationConfig

    inner = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft wraps the model
    own = inner.generation_config
    special = {
        k: getattr(own, k, None) for k in ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")
    }
    inner.generation_config = GenerationConfig(**{k: v for k, v in special.items() if v is not None})
    try:
        yield
    finally:
        inner.generation_config = own


class HFEngine(RolloutEngine):
    name = "hf"
    samples_from_trainer = True

    def __init__(self, model, tokenizer, max_batch: int = 256, autocast_dtype: torch.dtype | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch = max_batch
        # float32 master weights with bf16 compute (full fine-tuning): sample under autocast as the
        # update computes, instead of running generation in float32
        self.autocast_dtype = autocast_dtype
        eos = model.generation_config.eos_token_id
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        self.eos_ids = sorted(set(eos) | {tokenizer.eos_token_id} - {None})
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def generate(self, prompts: list[str], n: int, sampling: SamplingConfig) -> Rollouts:
        # Prompts are rendered by the chat template already: no extra BOS/special tokens.
        prompt_ids = [self.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        rows = [ids for ids in prompt_ids for _ in range(n)]  # prompt i -> rows i*n .. i*n+n-1
        completions, logprobs, decode_steps, sequence_steps = [], [], 0, 0
        devices = [self.device] if self.device.type == "cuda" else []
        # A seeded call samples from its own stream and leaves the caller's RNG untouched; an
        # unseeded call draws from (and advances) the global RNG, so repeated calls differ.
        forked = torch.random.fork_rng(devices=devices) if sampling.seed is not None else nullcontext()
        autocast = torch.autocast(self.device.type, self.autocast_dtype) if self.autocast_dtype else nullcontext()
        with forked, torch.no_grad(), eval_mode(self.model), autocast:
            if sampling.seed is not None:
                torch.manual_seed(sampling.seed)
            for start in range(0, len(rows), self.max_batch):
                ids, lps, width = self._generate_batch(rows[start : start + self.max_batch], sampling)
                decode_steps += width  # generate runs every row until the call's longest one stops
                sequence_steps += width * len(ids)
                completions += ids
                logprobs += lps
        # Decode without EOS/padding but keeping other special tokens: answer-format tags such as
        # <think> can be special tokens of a tokenizer, and the format reward must see them.
        texts = [
            self.tokenizer.decode(
                [t for t in c if t not in self.eos_ids and t != self.pad_id], skip_special_tokens=False
            )
            for c in completions
        ]
        group = lambda xs: [xs[i * n : (i + 1) * n] for i in range(len(prompts))]
        meta = {"engine": self.name, "decode_steps": decode_steps, "decode_sequence_steps": sequence_steps}
        return Rollouts(prompt_ids, group(completions), group(texts), group(logprobs), meta=meta)

    def _generate_batch(self, rows: list[list[int]], sampling: SamplingConfig):
        from transformers import GenerationConfig, LogitsProcessorList

        batch = self.tokenizer.pad({"input_ids": rows}, padding=True, padding_side="left", return_tensors="pt")
        batch = {k: v.to(self.device) for k, v in batch.items()}
        greedy = sampling.temperature == 0
        recorder = TemperatureWithLogprobs(1.0 if greedy else sampling.temperature)
        config = GenerationConfig(
            do_sample=not greedy,
            num_beams=1,
            temperature=1.0,  # applied by `recorder`
            top_k=0 if greedy else sampling.top_k,
            top_p=1.0 if greedy else sampling.top_p,
            min_p=None if greedy or not sampling.min_p else sampling.min_p,
            repetition_penalty=sampling.repetition_penalty,
            max_new_tokens=sampling.max_new_tokens,
            eos_token_id=self.eos_ids,
            pad_token_id=self.pad_id,
        )
        cache = self.prefill_shared_prompts(rows, batch)
        with neutral_generation_config(self.model):
            # synced_gpus=False: transformers would otherwise keep the processes of a sharded (FSDP)
            # model decoding in lockstep; the trainer generates on gathered, whole weights instead
            out = self.model.generate(
                **batch,
                past_key_values=cache,
                generation_config=config,
                logits_processor=LogitsProcessorList([recorder]),
                synced_gpus=False,
            )
        new_tokens = out[:, batch["input_ids"].shape[1] :]
        token_logprobs = recorder.logprobs(new_tokens)
        ids, lps = [], []
        for tokens, lp in zip(new_tokens.tolist(), token_logprobs.tolist()):
            length = next((i + 1 for i, t in enumerate(tokens) if t in self.eos_ids), len(tokens))
            ids.append(tokens[:length])  # up to and including the first EOS
            lps.append(lp[:length])
        return ids, lps, new_tokens.shape[1]

    def prefill_shared_prompts(self, rows: list[list[int]], batch: dict):
        """The KV cache of every row's prompt but its last token, computed once per distinct prompt
        and copied to the rows holding it; None when no two rows share a prompt (evaluation) or the
        prompts are one token wide. generate then runs only the last prompt token of each row before
        sampling: it takes the cache's length as the position to start from. Why not let generate
        prefill every row: n rollouts of a prompt would run its tokens through the model n times, the
        bulk of a step's generation when completions are short (GSM8K on CPU: 64 x 140 prompt tokens)."""
        distinct: dict[tuple[int, ...], int] = {}
        row_prompt = [distinct.setdefault(tuple(ids), len(distinct)) for ids in rows]
        width = batch["input_ids"].shape[1]
        if len(distinct) == len(rows) or width < 2:
            return None
        first_row = [row_prompt.index(i) for i in range(len(distinct))]  # a row of each distinct prompt
        ids, mask = batch["input_ids"][first_row, :-1], batch["attention_mask"][first_row, :-1]
        # positions as generate derives them from a left-padded attention mask
        positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 1)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
        cache = out.past_key_values
        cache.batch_select_indices(torch.tensor(row_prompt, device=ids.device))
        return cache

    def sync_weights(self, model) -> None:
        """Nothing to copy when the engine samples from the trainer's model object itself."""
        if model is not self.model:
            self.model.load_state_dict(model.state_dict())


@ENGINES.register("hf")
def start_hf_engine(setup: EngineSetup, model, tokenizer) -> HFEngine:
    """transformers `generate` on the trainer's own model (engine.max_batch rows a call)."""
    autocast = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(setup.mixed_precision)
    return HFEngine(model, tokenizer, max_batch=setup.max_batch, autocast_dtype=autocast)
