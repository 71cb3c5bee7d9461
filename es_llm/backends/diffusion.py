"""Generation from a masked-diffusion LM (the testbed's, or any ``AutoModelForMaskedLM``
folder that ships ``diffusion_sampling.json``) with the project's samplers.

The sampler settings saved with the model are the defaults, so evaluation, ES and RL decode
the same way unless a caller passes other settings. ``SamplingParams.max_tokens`` cuts the
text of a completion, never the canvas (the model was trained on a fixed canvas length).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Hashable, Sequence

import torch
from tqdm.auto import tqdm

from es_llm.backends.base import Completion, SamplingParams
from es_llm.diffusion.sampler import Canvas, DiffusionSampling, sample
from es_llm.errors import BadInput
from es_llm.io import SAMPLING_FILE


def is_diffusion_model(path: str | Path) -> bool:
    return (Path(path) / SAMPLING_FILE).is_file()


def saved_sampling(path: str | Path) -> DiffusionSampling:
    """The sampler settings a diffusion model folder was saved with."""
    from es_llm.config import from_dict

    file = Path(path) / SAMPLING_FILE
    try:
        data = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise BadInput(f"{file} is not readable JSON ({exc}).") from None
    return from_dict(DiffusionSampling, data, prefix="diffusion_sampling.")


@dataclass(frozen=True)
class DiffusionTrace:
    """One decoded canvas: every position's token (``canvas_L``, EOS fill included), the step
    that committed it (``step_map_L``) and, when recorded, the canvas after each step
    (``states_S_L``, int tensor, S = steps taken)."""

    canvas_L: tuple[int, ...]
    step_map_L: tuple[int, ...]
    states_S_L: torch.Tensor | None = None


class DiffusionBackend:
    """Batched diffusion sampling on the CPU (or a given device); the same interface as the
    autoregressive backends, plus ``sample_canvases`` for callers that need the step map."""

    name = "diffusion"

    def __init__(self, model_path: str, sampling: DiffusionSampling | None = None,
                 batch_size: int = 256, device: str = "cpu", model=None, tokenizer=None,
                 record_states: bool = False):
        from transformers import AutoModelForMaskedLM, AutoTokenizer

        self.sampling = sampling or saved_sampling(model_path)
        self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(model_path)
        if self.tokenizer.mask_token_id is None:
            raise BadInput(f"{model_path}: the tokenizer has no mask token, which a masked "
                           f"diffusion model needs.")
        self.model = model or AutoModelForMaskedLM.from_pretrained(model_path)
        self.model.to(device).eval()
        self.device = device
        self.batch_size = batch_size
        # Keep every intermediate canvas in each completion's trace (on-policy self-
        # distillation reads them); off for evaluation, where they would only cost memory.
        self.record_states = record_states

    def _denoise(self, ids_B_T: torch.Tensor, attention_B_T: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids_B_T.to(self.device),
                          attention_mask=attention_B_T.to(self.device)).logits.cpu()

    def sample_canvases(self, prompt_ids: list[list[int]], temperature: float,
                        generator: torch.Generator, record_states: bool = False) -> Canvas:
        tok = self.tokenizer
        return sample(self._denoise, prompt_ids, self.sampling, temperature, generator,
                      tok.mask_token_id, tok.pad_token_id, record_states)

    def generate(self, prompts: Sequence[str | Sequence[int]], params: SamplingParams,
                 progress: bool = False, keys: Sequence[Hashable] | None = None
                 ) -> list[list[Completion]]:
        """``params.n`` samples per prompt from the masked-diffusion sampler; like the HF loop,
        one generator seeded with ``params.seed`` serves the whole call (``keys`` unused)."""
        if params.top_p < 1.0 or params.logprobs or params.stop:
            raise BadInput("the diffusion backend samples with temperature only: top_p < 1, "
                           "stop strings and per-token logprobs are not defined for it "
                           "(its trainers estimate log-probs from the recorded trace).")
        encoded = [self.tokenizer(p).input_ids if isinstance(p, str) else list(p) for p in prompts]
        jobs = [(p, s) for p in range(len(prompts)) for s in range(params.n)]
        results: list[list[Completion | None]] = [[None] * params.n for _ in prompts]
        generator = torch.Generator().manual_seed(params.seed)
        bar = tqdm(total=len(jobs), desc="generate[diffusion]", unit="seq", disable=not progress)
        for start in range(0, len(jobs), self.batch_size):
            chunk = jobs[start:start + self.batch_size]
            canvas = self.sample_canvases([encoded[p] for p, _ in chunk], params.temperature,
                                          generator, record_states=self.record_states)
            L = self.sampling.gen_length
            tokens_B_L = canvas.ids_B_T.gather(1, canvas.canvas_index(L))
            states_S_B_L = torch.stack(canvas.states) if canvas.states else None
            for i, ((p, s), row) in enumerate(zip(chunk, tokens_B_L.tolist())):
                trace = DiffusionTrace(tuple(row), tuple(canvas.step_map_B_L[i].tolist()),
                                       states_S_B_L[:, i].clone() if states_S_B_L is not None
                                       else None)
                results[p][s] = self._finish(row, params.max_tokens, trace)
            bar.update(len(chunk))
        bar.close()
        return results  # type: ignore[return-value]

    def _finish(self, canvas: list[int], max_tokens: int, trace: DiffusionTrace) -> Completion:
        eos = self.tokenizer.eos_token_id
        ids = canvas[:canvas.index(eos) + 1] if eos in canvas else canvas
        finish = "stop" if ids and ids[-1] == eos else "length"
        if len(ids) > max_tokens:
            ids, finish = ids[:max_tokens], "length"
        body = ids[:-1] if finish == "stop" else ids
        text = self.tokenizer.decode(body, skip_special_tokens=False)
        return Completion(text=text, token_ids=tuple(ids), logprobs=None, finish_reason=finish,
                          trace=trace)

    def close(self) -> None:
        self.model = None
