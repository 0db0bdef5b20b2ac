"""torchtitan v0.2.2: what it launches, and the job TOML that launches it.

torchtitan builds a registered model (``[model] name`` and ``flavor``) and composes PyTorch's
own parallelisms: tensor parallelism with the norms always sharded along the sequence, FSDP2
(``fully_shard``) for sharded data parallelism, DDP only when data parallelism is the only
parallelism, and ``torch.distributed.pipelining`` schedules. The planner's ZeRO stages map to
FSDP2 where it runs exactly as priced:

- without a pipeline, ``fsdp_reshard_after_forward = "always"`` is ZeRO-3 (the loop
  accumulates microbatches without ``no_sync``, so every backward reduce-scatters), and
  ``"never"`` is ZeRO-2 when a step is one microbatch (with more, FSDP2 gathers the weights
  again for every microbatch's forward);
- under a pipeline, PyTorch defers FSDP2's gradient reduction and resharding to after the last
  microbatch (``backward_maybe_with_nosync``, ``_post_backward``): with ``"never"`` that is
  ZeRO-1, its once-per-step gather prefetched under the first forward.

The rules (:mod:`planner.frameworks._torchtitan_rules`) cite pytorch/torchtitan at v0.2.2
(73a0e69) and pytorch/pytorch at v2.13.0 (cf30153).
"""

from __future__ import annotations

from planner.errors import ConfigError
from planner.frameworks._torchtitan_checkpointing import activation_checkpoint_table
from planner.frameworks._torchtitan_flavors import (
    FLAVORS,
    REPO,
    VERSION,
    Flavor,
    flavor,
    flavor_differences,
)
from planner.frameworks._torchtitan_rules import RULES, TORCH, model_flavor
from planner.frameworks._torchtitan_toml import (
    compile_table,
    data_parallel_table,
    model_parallel_table,
    pipeline_table,
    render,
    training_table,
)
from planner.frameworks.base import Launch, Profile
from planner.plan.config import ResolvedConfig
from planner.spec import ModelSpec
from planner.vocabulary import OP_SAC

__all__ = ["FLAVORS", "PROFILE", "RULES", "TORCH", "VERSION", "flavor", "flavor_differences",
           "launch", "model_flavor"]


# --- the launcher --------------------------------------------------------------------------------

def launch(resolved: ResolvedConfig, model: ModelSpec) -> Launch:
    """The configuration as torchtitan v0.2.2 TOML tables, to merge into a job config.

    Only called on configurations no rule of :data:`RULES` refuses.
    """
    found = flavor(model)
    if found is None:  # the model-flavor rule refuses it before any launch
        raise ConfigError(model_flavor(resolved, model) or model.name)
    tables = {
        "model": {"name": found.name, "flavor": found.flavor},
        "training": training_table(resolved),
        "parallelism": {**data_parallel_table(resolved), **model_parallel_table(resolved, model),
                        **pipeline_table(resolved)},
        "activation_checkpoint": activation_checkpoint_table(resolved, model),
        "compile": compile_table(resolved),
    }  # fmt: skip
    header = f"# torchtitan {VERSION} ({REPO}): {model.name}\n"
    return Launch(text=header + render(tables), notes=notes(found, model))


def notes(found: Flavor, model: ModelSpec) -> tuple[str, ...]:
    """What the user adds, and where the flavor torchtitan builds is not quite the model."""
    flex = (f"{found.name} {found.flavor} attends block-causally within each document "
            f"(FlexAttention): the plan prices causal attention over the whole sequence, its "
            f"cost when a sample is one document and an upper bound otherwise",)
    return (
        f"for torchtitan {VERSION} ({REPO}) with a PyTorch it supports; merge the tables into "
        f"a job config such as train_configs/*.toml",
        f"[model] is the flavor registered at {found.source}; add its hf_assets_path (the "
        f"tokenizer), the dataset, [optimizer], [lr_scheduler], training.steps and [checkpoint]",
        *(flex if found.flex_attention else ()),
        *flavor_differences(found, model),
    )


PROFILE = Profile(name="torchtitan", title="torchtitan", rules=RULES, launch=launch,
                  zero_bubble=True, folds_experts=True, context_parallelism=("allgather",),
                  stacks=("torchtitan-eager", "torchtitan-compiled"),
                  selective_modules=OP_SAC)
"""torchtitan as a framework target."""
