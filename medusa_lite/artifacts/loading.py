"""``load()``: a target model, its Medusa heads and the tree to decode with, in one call.

``load()`` with no arguments returns the default model (SmolLM2-135M-Instruct) with the heads
shipped in ``medusa_lite/assets/smollm2-135m-heads/``; ``load(model_path, heads=heads_path)``
does the same for any Hugging Face causal LM and a heads folder or Hub repo.

Which tree the returned model decodes with (``model.tree``), first match wins:

1. the ``tree=`` argument: a :class:`Tree`, a :class:`DynamicTree`, a list of rank paths, or a
   ``tree.json`` file (its dynamic policy when it has one);
2. ``tree.json`` next to the heads, written by ``medusa-lite calibrate``: its dynamic policy
   when it has one, else its static tree;
3. :func:`default_tree` for the heads: ``training_summary["tree"]``, else Medusa's greedy
   construction from ``training_summary["topk_accuracy"]``, else from reference accuracies.

A dynamic policy read from a file is priced with this machine's step costs, measured on first
use and cached (:mod:`medusa_lite.trees.costs`); a :class:`DynamicTree` given as an object keeps its own.

The datastore (``model.datastore``, :mod:`medusa_lite.proposers.datastore`): ``datastore.safetensors``
next to the heads when there is one, unless ``datastore=`` names another file or is False.

The heads, ``tree.json``, the datastore and a Medusa-2 adapter are one artifact (layout in
:mod:`medusa_lite.artifacts.files`), read from one local folder or Hub repo (:mod:`medusa_lite.artifacts.resolve`,
with the same revision, token and cache). When the artifact has an adapter, the returned model is
the adapted one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from medusa_lite.artifacts.base import CONFIG_NAME, config_kind, heads_file
from medusa_lite.artifacts.default_model import DEFAULT_MODEL_NAME
from medusa_lite.artifacts.files import TREE_FILE_NAME, adapt_target
from medusa_lite.artifacts.resolve import ArtifactSource, resolve_source
from medusa_lite.cpu.prepack import (
    ROW_GEMM,
    check_prepack_supported,
    prepack_backend,
    prepack_linears,
    prepack_supported,
)
from medusa_lite.decoding.architectures import check_architecture, model_class_for, tree_attention_implementation
from medusa_lite.decoding.attention import TREE_SDPA
from medusa_lite.decoding.model import MedusaModel, base_model_name, text_config
from medusa_lite.drafters.draft_vocab import DraftLMHead
from medusa_lite.drafters.hydra.heads import HydraHeads
from medusa_lite.drafters.hydra.proposer import HydraProposer
from medusa_lite.drafters.medusa.config import HEADS_WHAT
from medusa_lite.drafters.medusa.heads import MedusaHeads
from medusa_lite.drafters.medusa.proposer import default_proposers
from medusa_lite.drafters.registry import artifact_classes, kind_of, kind_recorded, registered
from medusa_lite.drafters.sequential.drafter import SequentialDrafter
from medusa_lite.drafters.sequential.proposer import (
    DEFAULT_DRAFTER_NODES,
    DEFAULT_DRAFTER_TOPK,
    SequentialDrafterProposer,
)
from medusa_lite.errors import AdapterError, HeadsFileError, MedusaError, TreeError
from medusa_lite.proposers.base import Proposer, StepLimits, as_proposers, step_rows
from medusa_lite.proposers.datastore import DATASTORE_FILE_NAME, Datastore
from medusa_lite.proposers.lookup import default_lookups
from medusa_lite.trees.costs import Proposal, step_costs
from medusa_lite.trees.dynamic_tree import DEFAULT_TOKENS_PER_COST, UNMEASURED_ROW_COSTS, DynamicTree
from medusa_lite.trees.tree import Tree, as_tree
from medusa_lite.values import as_integer

DEFAULT_HEADS_DIR = Path(__file__).resolve().parents[1] / "assets" / "smollm2-135m-heads"
TREE_FILE_FORMAT = "medusa-lite-tree/1"
# The drafter's weights, packed for the row_gemm kernel, are rounded to bfloat16: it reads them once per
# drafted depth every step, and half the bytes lets them stay in the last-level cache between those forwards
# (docs/results.md: the drafter's cost). Its guesses change by that rounding only; acceptance stays exact.
DRAFTER_PACKED_DTYPE = torch.bfloat16
# SDPA that keeps grouped-query keys/values unexpanded under the tree mask on CPU (medusa_lite.decoding.attention).
ATTN_IMPLEMENTATION = TREE_SDPA

TreeSpec = Tree | DynamicTree | Iterable[Sequence[int]] | str | os.PathLike | None
DatastoreSpec = Datastore | str | os.PathLike | bool | None


class MissingHeadsError(MedusaError, FileNotFoundError):
    """No Medusa heads were given and none are shipped for the requested model."""


# -- trees -------------------------------------------------------------------------------------
def read_tree_file(path: str | os.PathLike, *, dynamic: bool = True) -> Tree | DynamicTree:
    """The tree in a ``tree.json`` file: ``{"format": "medusa-lite-tree/1", "paths": [[0], [0, 0], ...], ...}``.

    With a ``"dynamic"`` entry (``{"max_nodes", "tokens_per_cost"}``, see
    :class:`DynamicTree`) the file describes a per-step policy, returned unless ``dynamic=False``;
    ``"paths"`` is then the static tree for the same hardware. The schema: ``format`` this
    version's (a hand-written file may leave it out), ``paths`` a list of top-k rank paths,
    ``num_nodes`` (if given) their count plus the root; other keys are notes.
    """
    path = Path(path)
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as error:
        raise TreeError(f"tree file {path} does not exist") from error
    except IsADirectoryError as error:
        raise TreeError(f"tree file {path} is a directory; pass the {TREE_FILE_NAME} file inside it") from error
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise TreeError(f"tree file {path} is not valid JSON ({error})") from error
    if not isinstance(values, dict) or not isinstance(values.get("paths"), list):
        raise TreeError(f"tree file {path} must hold a JSON object with a 'paths' list of top-k rank paths")
    file_format = values.get("format", TREE_FILE_FORMAT)
    if file_format != TREE_FILE_FORMAT:
        raise TreeError(
            f"tree file {path} has format {file_format!r}; this medusa-lite reads {TREE_FILE_FORMAT!r}: "
            "upgrade medusa-lite, or rewrite the file with infer/calibrate_tree.py"
        )
    try:
        tree = Tree.from_paths(values["paths"])
    except TreeError as error:
        raise TreeError(f"tree file {path}: 'paths': {error}") from error
    stated = values.get("num_nodes")
    if stated is not None and (as_integer(stated) != tree.num_nodes):
        raise TreeError(
            f"tree file {path} says num_nodes {stated!r} but its paths make {tree.num_nodes} (root included); "
            "the file is corrupt"
        )
    if dynamic and values.get("dynamic") is not None:
        return dynamic_tree_from(values["dynamic"], path)
    return tree


def dynamic_tree_from(values: object, path: Path) -> DynamicTree:
    """The :class:`DynamicTree` a tree file's ``"dynamic"`` entry describes; a clear error if it is malformed.

    Its step costs are :data:`~medusa_lite.trees.dynamic_tree.UNMEASURED_ROW_COSTS` until ``load`` measures
    this machine's (:mod:`medusa_lite.trees.costs`): a ``"row_costs"`` list that older files hold was measured
    on another machine, and is checked but not used.
    """
    if not isinstance(values, dict) or "max_nodes" not in values or not isinstance(values.get("row_costs", []), list):
        raise TreeError(
            f"tree file {path}: 'dynamic' must be an object with 'max_nodes' and optionally 'tokens_per_cost'"
        )
    # What write_tree_file writes, or wrote (row_costs).
    known = set(DynamicTree(1, UNMEASURED_ROW_COSTS).portable_dict()) | {"row_costs"}
    unknown = sorted(set(values) - known)
    if unknown:
        raise TreeError(f"tree file {path}: 'dynamic' has unknown key(s) {unknown} (a typo?); known: {sorted(known)}")
    try:
        DynamicTree(
            1, tuple(values.get("row_costs") or UNMEASURED_ROW_COSTS)
        )  # an old file's costs must still be well formed
        return DynamicTree(
            values["max_nodes"], UNMEASURED_ROW_COSTS, values.get("tokens_per_cost", DEFAULT_TOKENS_PER_COST)
        )
    except TreeError as error:
        raise TreeError(f"tree file {path}: {error}") from error


def write_tree_file(path: str | os.PathLike, tree: Tree, notes: dict, dynamic: DynamicTree | None = None) -> Path:
    """Write ``tree.json``: the tree's paths, a dynamic policy if given, and free-form ``notes`` (how they were
    chosen).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    values = {"format": TREE_FILE_FORMAT, "num_nodes": tree.num_nodes, "paths": [list(p) for p in tree.paths]}
    if dynamic is not None:
        values["dynamic"] = dynamic.portable_dict()
    path.write_text(json.dumps({**values, **notes}, indent=1) + "\n", encoding="utf-8")
    return path


def heads_artifact(heads_source: str | os.PathLike | ArtifactSource) -> ArtifactSource:
    """The heads' folder or Hub repo, resolved (a missing folder or repo is a clear error)."""
    return heads_source if isinstance(heads_source, ArtifactSource) else resolve_source(heads_source, HEADS_WHAT)


def find_tree_file(heads_source: str | os.PathLike | ArtifactSource) -> Path | None:
    """``tree.json`` beside the heads, or None when there is none."""
    return heads_artifact(heads_source).file(TREE_FILE_NAME)


def resolve_datastore(
    datastore: DatastoreSpec, heads_source: ArtifactSource | None, vocab_size: int
) -> Datastore | None:
    """A :class:`Datastore` as given, read from a path, found beside the heads (``True``), or none
    (``False``/``None``).
    """
    if datastore is None or datastore is False:
        return None
    if isinstance(datastore, Datastore):
        return datastore
    if datastore is True:
        path = heads_source.file(DATASTORE_FILE_NAME) if heads_source is not None else None
        return Datastore.load(path, vocab_size) if path is not None else None
    return Datastore.load(datastore, vocab_size)


def resolve_tree(tree: TreeSpec, heads: MedusaHeads, heads_source: ArtifactSource | None) -> Tree | DynamicTree:
    """Apply the precedence documented at the top of this module: the files here, the rest :func:`as_tree`'s rule."""
    if isinstance(tree, (str, os.PathLike)):
        tree = read_tree_file(tree)
    elif tree is None:
        tree_file = find_tree_file(heads_source) if heads_source is not None else None
        tree = read_tree_file(tree_file) if tree_file is not None else None
    return as_tree(tree, heads.config.num_heads, heads.config.training_summary)


def tree_of(model: MedusaModel) -> Tree | DynamicTree:
    """The tree ``model`` decodes with when ``generate`` is given none."""
    return model.tree


# -- models and heads --------------------------------------------------------------------------
def default_dtype(device: str | torch.device) -> torch.dtype:
    """float32 on a CPU, bfloat16 on an accelerator.

    On CPU, float32 decoding was faster than bfloat16 (docs/results.md, "Measurements behind the code's
    choices") and is exact: verifying several tokens in one
    forward rounds like one-token steps, so greedy outputs equal plain greedy. bfloat16 halves the
    weights read per step, which is what pays on a GPU.
    """
    return torch.float32 if torch.device(device).type == "cpu" else torch.bfloat16


def load_target(
    model: str | os.PathLike | None,
    dtype: torch.dtype | str | None,
    device: str | torch.device,
    *,
    attn_implementation: str | None = None,
):
    """(causal LM in eval mode, tokenizer): the default model when ``model`` is None, else any HF model.

    ``dtype`` None: :func:`default_dtype` of ``device``; ``"auto"``: the checkpoint's own. The
    default model is converted from its GGUF file on first use (:mod:`medusa_lite.artifacts.default_model`).
    ``attn_implementation`` None: the fastest the model's class offers that takes a tree mask
    (:func:`~medusa_lite.decoding.architectures.tree_attention_implementation`).
    """
    dtype = dtype or default_dtype(device)
    if model is None:
        from medusa_lite.artifacts.default_model import (  # lazy: gguf
            DEFAULT_DTYPE,
            DEFAULT_MODEL_NAME,
            ensure_default_model,
        )

        source = ensure_default_model(dtype if isinstance(dtype, torch.dtype) else DEFAULT_DTYPE)
    else:
        resolve_source(model, "target model")  # a path that does not exist: a clear error, not a Hub lookup
        source = model
    if attn_implementation is None:
        attn_implementation = tree_attention_implementation(model_class_for(AutoConfig.from_pretrained(source)))
    base = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, attn_implementation=attn_implementation)
    tokenizer = AutoTokenizer.from_pretrained(source)
    if model is None:  # the cache folder is a copy of the default model: keep its Hub name
        base.config._name_or_path = DEFAULT_MODEL_NAME
    return base.to(device).eval(), tokenizer


def heads_source_for(model: str | os.PathLike | None, heads: str | os.PathLike | None) -> str | os.PathLike:
    """Where to load heads from; raise a clear error when there is nothing to load."""
    if heads is not None:
        return heads
    if model is not None:
        raise MissingHeadsError(
            f"no Medusa heads given for {str(model)!r}: pass heads=<folder or Hub repo> "
            "(train them with the train/ pipeline); shipped heads exist only for the default model"
        )
    if not (DEFAULT_HEADS_DIR / "config.json").is_file():
        raise MissingHeadsError(
            f"the default model's shipped heads are missing from {DEFAULT_HEADS_DIR} (config.json + "
            "model.safetensors): "
            "reinstall medusa-lite, or train heads with the train/ pipeline and pass heads=<folder>"
        )
    return DEFAULT_HEADS_DIR


def verification_rows(num_nodes: int) -> int:
    """The most rows a decoding step verifies with a tree of ``num_nodes``: its nodes + the default lookups' longest
    chain.
    """
    return num_nodes + default_lookups().max_nodes(StepLimits(model=None, max_depth=None))


def prepack_for_tree(base: torch.nn.Module, tree: Tree, prepack: bool | None, rows: int | None = None) -> None:
    """Pack ``base``'s linear layers for verifying ``rows`` rows (default: ``tree`` plus the default prompt-lookup
    chain).

    ``prepack`` None: when :func:`~medusa_lite.cpu.prepack.prepack_supported`; True: always (raise
    :class:`~medusa_lite.errors.UnsupportedModelError` when unsupported); False: never.
    """
    if prepack is False or (prepack is None and not prepack_supported(base)):
        return
    check_prepack_supported(base)
    prepack_linears(
        base, rows if rows is not None else verification_rows(tree.num_nodes)
    )  # too few rows for the backend: packs nothing


def read_artifact(source: ArtifactSource) -> MedusaHeads | SequentialDrafter | HydraHeads:
    """The drafter an artifact holds, of the registered kind (:mod:`medusa_lite.drafters.registry`) its
    config.json records."""
    path = heads_file(source, CONFIG_NAME)
    recorded = config_kind(path)
    kind = kind_recorded(recorded)
    if kind is None:
        known = ", ".join(repr(k.recorded_kind) for k in registered() if k.recorded_kind is not None)
        raise HeadsFileError(
            f"{path} records kind {recorded!r}, which medusa-lite does not know ({known}, or none for Medusa heads)"
        )
    return kind.artifact.from_source(source)


def read_drafter(
    heads: str | os.PathLike | MedusaHeads | SequentialDrafter | HydraHeads,
    *,
    heads_revision: str | None = None,
    token: str | bool | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> tuple[MedusaHeads | SequentialDrafter | HydraHeads, ArtifactSource | None]:
    """(the drafter module, the artifact it came from or None for a module given as it is)."""
    if isinstance(heads, artifact_classes()):
        return heads, None
    source = resolve_source(heads, HEADS_WHAT, revision=heads_revision, token=token, cache_dir=cache_dir)
    return read_artifact(source), source


def load(
    model: str | os.PathLike | None = None,
    *,
    heads: str | os.PathLike | MedusaHeads | None = None,
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
    tree: TreeSpec = None,
    datastore: DatastoreSpec = True,
    prepack: bool | None = None,
    heads_revision: str | None = None,
    token: str | bool | None = None,
    cache_dir: str | os.PathLike | None = None,
    proposers: Proposer | Sequence[Proposer] | None = None,
) -> tuple[MedusaModel, PreTrainedTokenizerBase]:
    """``(MedusaModel, tokenizer)`` ready for :func:`medusa_lite.generate`; ``model.tree`` is its tree.

    ``dtype`` None: :func:`default_dtype` (float32 on CPU, bfloat16 on an accelerator).

    ``model``: a local folder or Hub id of a causal LM (None: the default SmolLM2-135M-Instruct).
    ``heads``: a heads folder, Hub repo or :class:`MedusaHeads` (None: the heads shipped for the
    default model). The rest: as :func:`attach`, which this is after :func:`load_target`.
    """
    drafter, source = read_drafter(
        heads_source_for(model, heads),
        heads_revision=heads_revision,
        token=token,
        cache_dir=cache_dir,
    )
    base, tokenizer = load_target(model, dtype, device)
    medusa = attach_drafter(
        base, drafter, source, tree=tree, datastore=datastore, prepack=prepack, proposers=proposers
    )
    return medusa, tokenizer


def attach(
    base_model: PreTrainedModel,
    heads: str | os.PathLike | MedusaHeads | SequentialDrafter | HydraHeads | None = None,
    *,
    tree: TreeSpec = None,
    datastore: DatastoreSpec = True,
    prepack: bool | None = None,
    heads_revision: str | None = None,
    token: str | bool | None = None,
    cache_dir: str | os.PathLike | None = None,
    proposers: Proposer | Sequence[Proposer] | None = None,
    adapt: bool = True,
) -> MedusaModel:
    """A target already loaded (any causal LM, on its device and dtype) with a drafter artifact, ready to decode.

    ``heads``: an artifact folder or Hub repo of any registered kind, or its module (None: the heads
    shipped for the default model, when ``base_model`` is it). ``tree``: see the module docstring.
    ``datastore``: True = ``datastore.safetensors`` beside the heads when there is one
    (:mod:`medusa_lite.proposers.datastore`), a path or :class:`Datastore`, or False for none.
    ``heads_revision``, ``token``, ``cache_dir``: how to download the artifact from the Hub (every
    file from the same revision).

    An artifact with a Medusa-2 adapter (``adapter/``, :mod:`medusa_lite.artifacts.files`) is merged into
    the target, so the model returned wraps the adapted one; an adapter that does not fit the target
    raises :class:`~medusa_lite.errors.AdapterError`. ``adapt=False`` refuses such an artifact instead
    (merging changes ``base_model`` in place: ``custom_generate`` must leave the user's model as it is).

    ``prepack``: pack the target's linear weights for few-row products, up to the tree + the
    default lookup chain (:mod:`medusa_lite.cpu.prepack`: the row_gemm kernel, else oneDNN). None: when
    possible (float32 on CPU); True: raise if not possible; False: never (the target is left as it is).

    ``proposers``: the sources of guesses ``generate`` uses by default (``model.proposers``,
    :mod:`medusa_lite.proposers.base`); None: the lookups, then the drafter. The weights are
    packed for the most rows a step of theirs verifies.
    """
    if heads is None:
        if base_model_name(base_model) != DEFAULT_MODEL_NAME:
            raise MissingHeadsError(
                f"no Medusa heads given for {base_model_name(base_model)!r}: pass heads=<folder or Hub repo> "
                f"(shipped heads exist only for the default model, {DEFAULT_MODEL_NAME})"
            )
        heads = heads_source_for(None, None)
    drafter, source = read_drafter(heads, heads_revision=heads_revision, token=token, cache_dir=cache_dir)
    if not adapt and getattr(drafter.config, "backbone_adapter", False):
        raise AdapterError(
            "these heads were trained with a LoRA adapter on the base model (Medusa-2), which would be merged into "
            "the model in place: load them with medusa_lite.load(model, heads=...) instead"
        )
    return attach_drafter(
        base_model, drafter, source, tree=tree, datastore=datastore, prepack=prepack, proposers=proposers
    )


def attach_drafter(
    base: PreTrainedModel,
    drafter: MedusaHeads | SequentialDrafter | HydraHeads,
    source: ArtifactSource | None,
    *,
    tree: TreeSpec,
    datastore: DatastoreSpec,
    prepack: bool | None,
    proposers,
) -> MedusaModel:
    """:func:`attach` for a drafter already read: heads on their tree, or a drafter growing its own trees."""
    check_architecture(text_config(base))  # a family no tree verifies: refused before the drafter is fitted
    if kind_of(drafter).drafting is not None:  # a drafter growing its own trees, beside the lookups
        return attach_growing_drafter(
            base, drafter, source, tree=tree, datastore=datastore, prepack=prepack, proposers=proposers
        )
    base = adapt_target(base, source, drafter.config)
    store = resolve_datastore(datastore, source, drafter.config.vocab_size)
    proposers = default_proposers() if proposers is None else as_proposers(proposers)
    medusa = MedusaModel(
        base, drafter, tree=resolve_tree(tree, drafter, source), datastore=store, proposers=proposers
    ).eval()
    prepack_for_tree(medusa.base_model, medusa.tree, prepack, step_rows(medusa.proposers, medusa))
    if medusa.draft_lm_head is not None and prepack_backend(medusa.base_model) == ROW_GEMM:
        medusa.draft_lm_head.pack_for_few_rows(medusa.num_heads)  # the heads' projection: one row per head
    if isinstance(medusa.tree, DynamicTree) and not isinstance(
        tree, DynamicTree
    ):  # a policy given as an object keeps its costs
        medusa.tree = priced_here(medusa, medusa.tree)
    return medusa


def attach_growing_drafter(
    base: PreTrainedModel,
    drafter: SequentialDrafter | HydraHeads,
    source: ArtifactSource | None,
    *,
    tree: TreeSpec,
    datastore: DatastoreSpec,
    prepack: bool | None,
    proposers,
) -> MedusaModel:
    """:func:`attach` for a drafting artifact (a sequential drafter or Hydra-style heads): the target without
    Medusa heads, proposing with the lookups and the drafter (:mod:`medusa_lite.drafters.sequential.proposer`,
    :mod:`medusa_lite.drafters.hydra.proposer`), its trees sized by this machine's row costs.

    ``tree``: None (a policy of up to :data:`DEFAULT_DRAFTER_NODES` drafter nodes priced here), or a
    :class:`DynamicTree` / ``tree.json`` path whose ``max_nodes`` and ``tokens_per_cost`` it keeps.
    """
    keeps_costs = isinstance(tree, DynamicTree)  # a policy given as an object keeps its costs, as for heads
    if isinstance(tree, (str, os.PathLike)):
        tree = read_tree_file(tree)
    elif tree is None and source is not None and find_tree_file(source) is not None:
        tree = read_tree_file(find_tree_file(source))
    if tree is not None and not isinstance(tree, DynamicTree):
        raise TreeError(
            "a sequential drafter grows its own tree each step: pass tree=None or a DynamicTree (the budget "
            "and price of its rows)"
        )
    policy = tree if tree is not None else DynamicTree(1 + DEFAULT_DRAFTER_NODES, UNMEASURED_ROW_COSTS)
    store = resolve_datastore(datastore, source, drafter.config.vocab_size)
    medusa = MedusaModel(
        base, None, datastore=store, proposers=() if proposers is None else as_proposers(proposers)
    ).eval()
    kind = kind_of(drafter).drafting
    if proposers is None:
        medusa.proposers = (default_lookups(), kind.proposer(drafter, max_new_nodes=policy.max_nodes - 1))
    prepack_for_tree(medusa.base_model, Tree(()), prepack, step_rows(medusa.proposers, medusa))
    if proposers is None:
        medusa.proposers = (
            default_lookups(),
            drafter_proposer_for(medusa, drafter, policy, price_here=not keeps_costs),
        )
    else:
        kind.check_fits(medusa, drafter)
        weight = base.get_output_embeddings().weight
        drafter.to(device=weight.device, dtype=weight.dtype)
    return medusa


def drafter_proposer_for(
    model: MedusaModel,
    drafter: SequentialDrafter | HydraHeads,
    policy: DynamicTree,
    *,
    price_here: bool = True,
    topk: int = DEFAULT_DRAFTER_TOPK,
) -> SequentialDrafterProposer | HydraProposer:
    """The drafter ready to decode with ``model``: on its device and dtype, its few-row products on the
    target's packed path (on row_gemm's, from weights packed in :data:`DRAFTER_PACKED_DTYPE`), expanding
    ``topk`` nodes a depth and adding up to ``policy.max_nodes - 1`` nodes a step, each step sized and gated
    by the policy's ``tokens_per_cost`` and step costs: this machine's, measured for the verified rows and the
    drafter's own work (:func:`priced_here`), unless ``price_here`` is False (the policy's own costs)."""
    kind = kind_of(drafter).drafting
    kind.check_fits(model, drafter)
    lm_head = model.base_model.get_output_embeddings()
    drafter.to(device=lm_head.weight.device, dtype=lm_head.weight.dtype)
    spec = kind.proposer(drafter, topk=topk, max_new_nodes=max(policy.max_nodes - 1, 1))
    ids = drafter.draft_token_ids
    draft_lm_head = None if ids is None else DraftLMHead(lm_head, ids)
    backend = prepack_backend(model.base_model)
    packed_dtype = DRAFTER_PACKED_DTYPE if backend == ROW_GEMM else torch.float32
    if backend is not None:
        prepack_linears(drafter, spec.packed_rows(), backend, min_rows=1, packed_dtype=packed_dtype)
    if backend == ROW_GEMM and draft_lm_head is not None:
        draft_lm_head.pack_for_few_rows(spec.packed_rows(), packed_dtype)
    spec = replace(spec, draft_lm_head=draft_lm_head)
    return replace(spec, costs=priced_here(model, policy, kind.proposal(spec, model)) if price_here else policy)


def priced_here(model: MedusaModel, policy: DynamicTree, proposal: Proposal | None = None) -> DynamicTree:
    """``policy`` with this machine's step costs for ``model`` and its ``proposal`` (default: the heads')
    (:func:`medusa_lite.trees.costs.step_costs`: cached, or measured now).
    """
    costs = step_costs(model, verification_rows(policy.num_nodes), proposal)
    return policy.with_costs(costs.row_costs, costs.proposal_cost)
