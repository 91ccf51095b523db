"""The Orbax -> Hugging Face name/transform table (spec G), as data, and its expansion for one config.

Every output tensor is `transpose(source[select], perm)` reshaped to the Hugging Face shape, where `source` is one
Orbax array. A reshape never changes the C-order bytes, so the output's bytes are those of the transposed selection:
the converter can cast and write it in slices along the transposed array's first axis, and the tests build an Orbax
tree from a Hugging Face state dict by running the same rule backwards (`source_part_from_target`).

Dimension letters (resolved per layer from the config, spec A.4):
  text:   V vocab, H hidden, N query heads, K kv heads, D head dim, I dense width, E experts, M expert width
  vision: vL layers, vN heads, vK kv heads, vD head dim, vH hidden, vI mlp width, vP patch inputs (3 * patch^2),
          vT position-table size
A dims string like "2 K H D" names the source axes; "K*D H" gives the Hugging Face shape.
"""

from dataclasses import dataclass

import numpy as np

from ..modeling.config import layer_shape

__all__ = ["PlannedTensor", "Rule", "RULES", "expand_rules", "source_part_from_target"]

TEXT_LAYER = "transformer/layer_{i}/"
VISION = "transformer/vision_encoder/"
VISION_BLOCK = VISION + "transformer/stacked_layers/block/"
DEC = "model.decoder."
DEC_LAYER = DEC + "layers.{i}."
TOWER = "model.encoder.vision_tower."
TOWER_LAYER = TOWER + "encoder.layers.{j}."


@dataclass(frozen=True)
class Rule:
    """One Orbax array (or part of it) -> one Hugging Face tensor.

    Attributes:
        node: Orbax node path relative to `params/` ("{i}": text layer); a leading "*/" matches any parent path
            (spec G: the self-conditioner and the projector are found by name, their location is unconfirmed).
        leaf: the array's leaf name under `node`.
        source: dims of the stored array, e.g. "vL 2 vK vH vD".
        target: Hugging Face key ("{i}": text layer, "{j}": vision layer).
        shape: dims of the Hugging Face tensor, e.g. "vK*vD vH".
        select: leading indices taken from the array first ("j": the vision layer of a stacked array).
        perm: axis order applied after `select` (None: as stored).
        when: which layers/configs the rule applies to: "all", "sliding", "full", "vision", "standardize".
        buffer: the target is a buffer, not a parameter (not counted in the index's `total_parameters`).
    """

    node: str
    leaf: str
    source: str
    target: str
    shape: str
    select: tuple = ()
    perm: tuple | None = None
    when: str = "all"
    buffer: bool = False


def _norm(node: str, target: str, dim: str = "H", when: str = "all") -> Rule:
    return Rule(node, "scale", dim, target, dim.split()[-1], when=when)


def _text_layer_rules() -> list[Rule]:
    n, t = TEXT_LAYER, DEC_LAYER
    attn = t + "self_attn."
    rules = [
        Rule(n + "attn/q_einsum", "w", "N H D", attn + "q_proj.weight", "N*D H", perm=(0, 2, 1)),
        Rule(n + "attn/kv_einsum", "w", "2 K H D", attn + "k_proj.weight", "K*D H", (0,), (0, 2, 1), "sliding"),
        Rule(n + "attn/kv_einsum", "w", "2 K H D", attn + "v_proj.weight", "K*D H", (1,), (0, 2, 1), "sliding"),
        Rule(n + "attn/k_einsum", "w", "K H D", attn + "k_proj.weight", "K*D H", perm=(0, 2, 1), when="full"),
        Rule(n + "attn/attn_vec_einsum", "w", "N D H", attn + "o_proj.weight", "H N*D", perm=(2, 0, 1)),
        _norm(n + "attn/query_norm", attn + "q_norm.weight", "D"),
        _norm(n + "attn/key_norm", attn + "k_norm.weight", "D"),
        _norm(n + "pre_attention_norm", t + "input_layernorm.weight"),
        _norm(n + "post_attention_norm", t + "post_attention_layernorm.weight"),
        # naming trap (spec G): Orbax mlp/ffw1 = MoE, mlp2/ffw2 = dense; HF _1 = dense, _2 = MoE
        Rule(n + "mlp/gating_einsum", "w", "E 2 M H", t + "experts.gate_up_proj", "E 2*M H"),
        Rule(n + "mlp/linear", "w", "E M H", t + "experts.down_proj", "E H M", perm=(0, 2, 1)),
        Rule(n + "mlp/router_logits", "w", "H E", t + "router.proj.weight", "E H", perm=(1, 0)),
        Rule(n + "mlp", "router_scale", "H", t + "router.scale", "H"),
        Rule(n + "mlp", "per_expert_scale", "E", t + "router.per_expert_scale", "E"),
        Rule(n + "mlp2/gating_einsum", "w", "2 I H", t + "mlp.gate_proj.weight", "I H", (0,)),
        Rule(n + "mlp2/gating_einsum", "w", "2 I H", t + "mlp.up_proj.weight", "I H", (1,)),
        Rule(n + "mlp2/linear", "w", "I H", t + "mlp.down_proj.weight", "H I", perm=(1, 0)),
        _norm(n + "pre_ffw_norm", t + "pre_feedforward_layernorm_2.weight"),
        _norm(n + "pre_ffw2_norm", t + "pre_feedforward_layernorm.weight"),
        _norm(n + "post_ffw1_norm", t + "post_feedforward_layernorm_2.weight"),
        _norm(n + "post_ffw2_norm", t + "post_feedforward_layernorm_1.weight"),
        _norm(n + "post_ffw_norm", t + "post_feedforward_layernorm.weight"),
        # spec B.2: layer_scalar is a buffer in both stacks, written twice as equal copies
        Rule(n.rstrip("/"), "skip_scale", "1", t + "layer_scalar", "1", buffer=True),
        Rule(n.rstrip("/"), "skip_scale", "1", "model.encoder.language_model.layers.{i}.layer_scalar", "1",
             buffer=True),
    ]
    return rules


def _vision_rules() -> list[Rule]:
    n, t = VISION_BLOCK, TOWER_LAYER
    attn = t + "self_attn."
    rules = [
        Rule("*/mm_input_projection", "w", "vH H", "model.encoder.embed_vision.embedding_projection.weight", "H vH",
             perm=(1, 0), when="vision"),
        Rule(VISION + "entry/input_projection", "w", "vP vH", TOWER + "patch_embedder.input_proj.weight", "vH vP",
             perm=(1, 0), when="vision"),
        Rule(VISION + "entry", "pos_emb", "vT 2 vH", TOWER + "patch_embedder.position_embedding_table", "2 vT vH",
             perm=(1, 0, 2), when="vision"),
        Rule(VISION + "standardize", "bias", "vH", TOWER + "std_bias", "vH", when="standardize", buffer=True),
        Rule(VISION + "standardize", "scale", "vH", TOWER + "std_scale", "vH", when="standardize", buffer=True),
        Rule(n + "attn/q_einsum", "w", "vL vN vH vD", attn + "q_proj.linear.weight", "vN*vD vH", ("j",), (0, 2, 1)),
        Rule(n + "attn/kv_einsum", "w", "vL 2 vK vH vD", attn + "k_proj.linear.weight", "vK*vD vH", ("j", 0),
             (0, 2, 1)),
        Rule(n + "attn/kv_einsum", "w", "vL 2 vK vH vD", attn + "v_proj.linear.weight", "vK*vD vH", ("j", 1),
             (0, 2, 1)),
        Rule(n + "attn/attn_vec_einsum", "w", "vL vN vD vH", attn + "o_proj.linear.weight", "vH vN*vD", ("j",),
             (2, 0, 1)),
        Rule(n + "attn/query_norm", "scale", "vL vD", attn + "q_norm.weight", "vD", ("j",)),
        Rule(n + "attn/key_norm", "scale", "vL vD", attn + "k_norm.weight", "vD", ("j",)),
        Rule(n + "mlp/gating_einsum", "w", "vL 2 vI vH", t + "mlp.gate_proj.linear.weight", "vI vH", ("j", 0)),
        Rule(n + "mlp/gating_einsum", "w", "vL 2 vI vH", t + "mlp.up_proj.linear.weight", "vI vH", ("j", 1)),
        Rule(n + "mlp/linear", "w", "vL vI vH", t + "mlp.down_proj.linear.weight", "vH vI", ("j",), (1, 0)),
    ]
    for orbax, hf in (("pre_attention_norm", "input_layernorm"), ("post_attention_norm", "post_attention_layernorm"),
                      ("pre_ffw_norm", "pre_feedforward_layernorm"), ("post_ffw_norm", "post_feedforward_layernorm")):
        rules.append(Rule(n + orbax, "scale", "vL vH", t + hf + ".weight", "vH", ("j",)))
    return [r if r.when != "all" else Rule(**{**r.__dict__, "when": "vision"}) for r in rules]


RULES: list[Rule] = [
    Rule("transformer/embedder", "input_embedding", "V H", DEC + "embed_tokens.weight", "V H"),
    _norm("transformer/final_norm", DEC + "norm.weight"),
    *_text_layer_rules(),
    Rule("*/self_conditioner/gating_einsum", "w", "2 I H", DEC + "self_conditioning.gate_proj.weight", "I H", (0,)),
    Rule("*/self_conditioner/gating_einsum", "w", "2 I H", DEC + "self_conditioning.up_proj.weight", "I H", (1,)),
    Rule("*/self_conditioner/linear", "w", "I H", DEC + "self_conditioning.down_proj.weight", "H I", perm=(1, 0)),
    _norm("*/self_conditioner/pre_norm", DEC + "self_conditioning.pre_norm.weight"),
    *_vision_rules(),
]


@dataclass(frozen=True)
class PlannedTensor:
    """One output tensor of one conversion: where it comes from and what it must look like.

    Attributes:
        key: Hugging Face key. node, leaf: the Orbax array (node as in the rule, "{i}" filled in; "*/" still open).
        source_shape: the stored array's expected shape. select: integer indices into its leading axes.
        perm: axes order after `select`. shape: the Hugging Face shape. buffer: see `Rule.buffer`.
    """

    key: str
    node: str
    leaf: str
    source_shape: tuple
    select: tuple
    perm: tuple | None
    shape: tuple
    buffer: bool

    @property
    def orbax_path(self) -> str:
        return f"params/{self.node}/{self.leaf}"

    def transposed_shape(self) -> tuple:
        """Shape of `transpose(source[select], perm)`: same bytes as the Hugging Face tensor."""
        part = self.source_shape[len(self.select):]
        return tuple(part[a] for a in self.perm) if self.perm else part


def _dims(spec: str, sizes: dict) -> tuple:
    out = []
    for token in spec.split():
        value = 1
        for name in token.split("*"):
            value *= int(name) if name.isdigit() else sizes[name]
        out.append(value)
    return tuple(out)


def _vision_sizes(vision) -> dict:
    return {"vL": vision.num_hidden_layers, "vN": vision.num_attention_heads, "vK": vision.num_key_value_heads,
            "vD": vision.head_dim, "vH": vision.hidden_size, "vI": vision.intermediate_size,
            "vP": 3 * vision.patch_size ** 2, "vT": vision.position_embedding_size}


def _applies(rule: Rule, layer_type: str | None, vision) -> bool:
    if rule.when == "all":
        return True
    if rule.when in ("sliding", "full"):
        return layer_type == f"{rule.when}_attention"
    if vision is None:
        return False
    return rule.when == "vision" or (rule.when == "standardize" and bool(getattr(vision, "standardize", False)))


def expand_rules(config, text_only: bool = False) -> list[PlannedTensor]:
    """Every output tensor for `config` (a DiffusionGemmaConfig), in writing order (grouped by source array).

    Args:
        config: the target model's config; its sizes give every expected shape.
        text_only: leave out the vision tower and the projector.
    Raises:
        ValueError: the config asks for a vision feature the converter cannot produce (clipped linears).
    """
    text = config.text_config
    vision = None if text_only else config.vision_config
    if vision is not None and getattr(vision, "use_clipped_linears", False):
        raise ValueError("the config's vision_config.use_clipped_linears is true: converting clipped-linear bounds "
                         "is not supported (the released 26B-A4B model does not use them); pass --text-only or a "
                         "config with use_clipped_linears false")
    sizes = {"V": text.vocab_size, "H": text.hidden_size, "N": text.num_attention_heads,
             "I": text.intermediate_size, "E": text.num_experts, "M": text.moe_intermediate_size}
    if vision is not None:
        sizes.update(_vision_sizes(vision))
    planned = []
    for rule in RULES:
        layered = "{i}" in rule.node
        for i in range(text.num_hidden_layers) if layered else [None]:
            layer_type = None
            local = dict(sizes)
            if layered:
                shape = layer_shape(text, i)
                layer_type = shape.layer_type
                local.update(K=shape.num_kv_heads, D=shape.head_dim)
            if not _applies(rule, layer_type, vision):
                continue
            for j in range(vision.num_hidden_layers) if "{j}" in rule.target else [None]:
                select = tuple(j if s == "j" else s for s in rule.select)
                planned.append(PlannedTensor(
                    key=rule.target.format(i=i, j=j), node=rule.node.format(i=i), leaf=rule.leaf,
                    source_shape=_dims(rule.source, local), select=select, perm=rule.perm,
                    shape=_dims(rule.shape, local), buffer=rule.buffer,
                ))
    first = {}
    for index, item in enumerate(planned):
        first.setdefault((item.node, item.leaf), index)
    return sorted(planned, key=lambda item: first[(item.node, item.leaf)])  # one source array after another


def source_part_from_target(item: PlannedTensor, value: np.ndarray) -> np.ndarray:
    """The rule run backwards: the part `source[item.select]` that converts to the Hugging Face tensor `value`."""
    transposed = np.asarray(value).reshape(item.transposed_shape())
    if item.perm is None:
        return transposed
    return transposed.transpose(np.argsort(item.perm))
