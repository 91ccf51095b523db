"""A constraint compiled to a token-level automaton over a tokenizer, with outlines-core's `Index`, cached per
(constraint, tokenizer, vocabulary size, EOS ids, pad id).

The automaton is the dense table `table[s, t]` (S states x V vocabulary rows, the next state, -1 where token t is not
allowed in state s), stored factorized: tokens that behave the same in every state share a class, so
`table = class_table[:, token_class]`. A JSON schema over a 262144-token vocabulary has a few hundred classes, so the
factors take kilobytes where the dense table would take S x V x 4 bytes, and the Viterbi pass (viterbi.py) works on
classes, not tokens.

Beyond the constraint's own states there is one more, DONE: from every accepting state an EOS id or the pad id
leads to DONE, and DONE allows only pad. Special tokens, EOS and pad ids never appear inside an answer; vocabulary
rows the tokenizer does not have are never allowed.

Legend: S states (DONE last), V vocabulary rows of the model, C token classes, E allowed (state, class) pairs.
"""

import json
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass

import torch

from .budget import DEFAULT_BUDGET, GIB, CompileBudget, run_within_budget
from .errors import ConstraintError
from .vocabulary import check_decode, token_bytes


@dataclass(frozen=True, eq=False)
class TokenAutomaton:
    """A constraint as a deterministic automaton over token ids.

    Attributes:
        token_class: [V] long, each vocabulary row's class (rows that are never allowed share one class).
        class_table: [S, C] long, the next state after a token of class c in state s, -1 where not allowed.
        initial: the start state (the end of the prompt).
        done: the DONE state (S - 1), reached by EOS or pad from an accepting state.
        accepting: [S] bool, where an answer may end (DONE included).
        distance: [S] long, the fewest tokens from each state to an accepting one (0 where accepting).
        src / cls / dst: [E] long, every allowed (state, class) pair and where it leads: the Viterbi edges.
        class_token: [C] long, one token of each class (a fallback when all of a class' logits are -inf).
        description: the constraint, for messages.
        pad_id: the padding id (the only token DONE allows), or None.
        constraint: the `Regex` / `JsonSchema` it was compiled from.
        spelled: [V] the bytes each token id spells (None: never inside an answer), as the automaton reads them.
        end_ids: the EOS ids and the pad id: where an answer ends.
    """

    token_class: torch.Tensor
    class_table: torch.Tensor
    initial: int
    done: int
    accepting: torch.Tensor
    distance: torch.Tensor
    src: torch.Tensor
    cls: torch.Tensor
    dst: torch.Tensor
    class_token: torch.Tensor
    description: str
    pad_id: int | None = None
    constraint: object = None
    spelled: tuple = ()
    end_ids: tuple = ()

    @property
    def num_states(self) -> int:
        return self.class_table.shape[0]

    @property
    def num_classes(self) -> int:
        return self.class_table.shape[1]

    @property
    def table(self) -> torch.Tensor:
        """[S, V] long: the dense transition table (-1: not allowed), materialized on demand."""
        return self.class_table[:, self.token_class]

    def to(self, device) -> "TokenAutomaton":
        device = torch.device(device)
        if self.token_class.device == device:
            return self
        moved = {name: getattr(self, name).to(device) for name in
                 ("token_class", "class_table", "accepting", "distance", "src", "cls", "dst", "class_token")}
        return TokenAutomaton(initial=self.initial, done=self.done, description=self.description, pad_id=self.pad_id,
                              constraint=self.constraint, spelled=self.spelled, end_ids=self.end_ids, **moved)

    def walk(self, states: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """states [R] long, tokens [R, N] -> the state after each row's tokens [R]; -1 once a token is not allowed
        (and from then on). On the device: N small gathers, no host read."""
        for i in range(tokens.shape[1]):
            nxt = self.class_table[states.clamp_min(0), self.token_class[tokens[:, i]]]
            states = torch.where(states < 0, states, nxt)
        return states

    def complete(self, states: torch.Tensor) -> torch.Tensor:
        """[R] bool: the answer may end here (an accepting state or DONE)."""
        return (states >= 0) & self.accepting[states.clamp_min(0)]


def index_transitions(regex: str, spelled: list[bytes | None], sentinel: int, description: str):
    """outlines-core's Index over the spelled tokens -> (transitions {state: (tokens, next states)} as int64 numpy
    arrays, initial, finals)."""
    import numpy as np
    from outlines_core import Index, Vocabulary

    by_bytes: dict[bytes, list[int]] = {}
    for token_id, data in enumerate(spelled):
        if data is not None:
            by_bytes.setdefault(data, []).append(token_id)
    vocabulary = Vocabulary(sentinel, by_bytes)
    try:
        index = Index(regex, vocabulary)
    except ValueError as error:
        message = str(error)
        if "following characters: []" in message:  # the DFA has a state with no way out: nothing matches
            raise ConstraintError(f"{description}: no answer can satisfy it (its language is empty)") from None
        if "incompatible with the regex" in message:
            raise ConstraintError(f"{description}: the tokenizer cannot spell it ({message})") from None
        raise ConstraintError(f"{description}: malformed or unsupported regular expression ({message})") from None
    transitions = {state: (np.fromiter(row.keys(), np.int64, len(row)), np.fromiter(row.values(), np.int64, len(row)))
                   for state, row in index.get_transitions().items()}  # arrays pickle fast (budget.py)
    return transitions, index.get_initial_state(), set(index.get_final_states())


def dense_table(transitions: dict, initial: int, finals: set, vocab_size: int, sentinel: int, eos_ids: list[int],
                pad_id: int | None, description: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The [S, V] int32 table over the states that can still reach an accepting one (the initial state first, DONE
    appended) and accepting [S] bool.

    Raises:
        ConstraintError: no answer satisfies the constraint.
    """
    states = sorted(set(transitions) | finals | {initial})
    empty = (torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long))
    edges = {s: tuple(map(torch.as_tensor, transitions[s])) if s in transitions else empty for s in states}
    # (the sentinel, outlines' EOS, is >= V: dropped below)
    # keep the states from which some accepting state can be reached (search over the reverse edges)
    parents: dict[int, set] = {}
    for s in states:
        for n in set(edges[s][1].tolist()):
            parents.setdefault(n, set()).add(s)
    live, todo = set(finals), list(finals)
    while todo:
        for p in parents.get(todo.pop(), ()):
            if p not in live:
                live.add(p)
                todo.append(p)
    if initial not in live:
        raise ConstraintError(f"{description}: no answer can satisfy it (its language is empty over this tokenizer)")
    order = [initial] + sorted(live - {initial})
    number = {s: i for i, s in enumerate(order)}
    S, done = len(order) + 1, len(order)
    renumber = torch.full((max(states) + 1,), -1, dtype=torch.int32)  # outlines' state id -> ours (-1: dropped)
    renumber[torch.tensor(order)] = torch.arange(len(order), dtype=torch.int32)
    table = torch.full((S, vocab_size), -1, dtype=torch.int32)
    for s in order:
        tokens, targets = edges[s]
        if len(tokens):
            targets = renumber[targets]
            keep = tokens < vocab_size
            table[number[s], tokens[keep]] = targets[keep]
    accepting = torch.zeros(S, dtype=torch.bool)
    accepting[[number[s] for s in finals if s in number]] = True
    ends = [e for e in list(eos_ids) + ([pad_id] if pad_id is not None else []) if 0 <= e < vocab_size]
    if ends:
        table[accepting.nonzero()[:, 0][:, None], torch.tensor(ends)[None]] = done
    if pad_id is not None and 0 <= pad_id < vocab_size:
        table[done, pad_id] = done
    accepting[done] = True
    return table, accepting


def factorize(table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[S, V] -> (class_table [S, C], token_class [V]) with table == class_table[:, token_class]: the distinct
    columns (a column is what a token does in every state)."""
    columns, token_class = torch.unique(table.T, dim=0, return_inverse=True)  # [C, S], [V]
    return columns.T.contiguous().long(), token_class.long()


def distances(class_table: torch.Tensor, accepting: torch.Tensor) -> torch.Tensor:
    """[S] the fewest tokens from each state to an accepting one (Bellman-Ford over the classes)."""
    big = 1 << 40
    dist = torch.where(accepting, 0, big)
    allowed = class_table >= 0
    for _ in range(class_table.shape[0]):
        reach = torch.where(allowed, dist[class_table.clamp_min(0)] + 1, big).amin(dim=1)
        new = torch.minimum(dist, reach)
        if torch.equal(new, dist):
            break
        dist = new
    return dist


def build_automaton(constraint, tokenizer, vocab_size: int, eos_ids: list[int], pad_id: int | None,
                    budget: CompileBudget = DEFAULT_BUDGET) -> TokenAutomaton:
    """Compile `constraint` (a `Regex`, `JsonSchema` or `ToolCalls`) over `tokenizer` for a model of `vocab_size`
    rows; the regex and outlines-core's Index are built within `budget` (budget.py)."""
    import outlines_core.json_schema  # noqa: F401 - imported before the fork, not in the child

    description = constraint.describe()
    spelled = token_bytes(tokenizer)[:vocab_size]  # ids beyond the model's vocabulary cannot be produced
    for text in getattr(constraint, "special_texts", ()):  # special tokens this constraint spells (ToolCalls)
        token_id = tokenizer.convert_tokens_to_ids(text)
        if isinstance(token_id, int) and token_id != tokenizer.unk_token_id and 0 <= token_id < len(spelled):
            spelled[token_id] = text.encode()
    for token_id in list(eos_ids) + ([pad_id] if pad_id is not None else []):
        if 0 <= token_id < len(spelled):
            spelled[token_id] = None  # EOS and pad end an answer; they never spell part of it
    check_decode(tokenizer, spelled, description)
    sentinel = max(vocab_size, len(spelled))  # outlines' EOS: an id no token has, stripped again
    transitions, initial, finals = run_within_budget(
        lambda: index_transitions(constraint.to_regex(), spelled, sentinel, description), budget, description)
    table_bytes = (len(transitions) + 2) * vocab_size * 4 * 3  # the int32 table, its transpose and unique's sort
    if table_bytes > budget.memory_bytes:
        raise ConstraintError(f"{description}: its automaton ({len(transitions)} states x {vocab_size} tokens) needs "
                              f"about {table_bytes / GIB:.3g} GiB, more than the budget of {budget.describe()}")
    table, accepting = dense_table(transitions, initial, finals, vocab_size, sentinel, eos_ids, pad_id, description)
    class_table, token_class = factorize(table)
    src, cls = (class_table >= 0).nonzero(as_tuple=True)
    class_token = torch.full((class_table.shape[1],), vocab_size, dtype=torch.long).scatter_reduce_(
        0, token_class, torch.arange(vocab_size), "amin")  # the first token of each class
    return TokenAutomaton(
        token_class=token_class, class_table=class_table, initial=0, done=table.shape[0] - 1, accepting=accepting,
        distance=distances(class_table, accepting), src=src, cls=cls, dst=class_table[src, cls],
        class_token=class_token, description=description,
        pad_id=pad_id if pad_id is not None and 0 <= pad_id < vocab_size else None,
        constraint=constraint, spelled=tuple(spelled),
        end_ids=tuple(eos_ids) + ((pad_id,) if pad_id is not None else ()),
    )


_FINGERPRINTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_CACHE: "OrderedDict[tuple, TokenAutomaton]" = OrderedDict()
_REFUSED: "OrderedDict[tuple, ConstraintError]" = OrderedDict()  # (key, budget) -> why, so a retry costs nothing
_LOCKS: dict = {}  # key -> lock: one compilation per key at a time (the server compiles from many threads)
_LOCKS_GUARD = threading.Lock()
CACHE_SIZE = 32


def tokenizer_fingerprint(tokenizer) -> int:
    """A hash of the tokenizer's vocabulary, special tokens and decoder, computed once per tokenizer object."""
    try:
        return _FINGERPRINTS[tokenizer]
    except (KeyError, TypeError):
        pass
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = json.dumps(json.loads(backend.to_str()).get("decoder")) if backend is not None else None
    key = hash((tuple(sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])),
                tuple(sorted(tokenizer.all_special_ids)), type(tokenizer).__name__,
                decoder))  # the decoder decides what `decode` gives (vocabulary.check_decode)
    try:
        _FINGERPRINTS[tokenizer] = key
    except TypeError:
        pass
    return key


def compile_constraint(constraint, tokenizer, vocab_size: int, eos_ids=(), pad_id: int | None = None,
                       budget: CompileBudget | None = None) -> TokenAutomaton:
    """The `TokenAutomaton` of `constraint` over `tokenizer`, from the cache when it was compiled (or refused) before.
    Safe to call from several threads: one key compiles once.

    Args:
        constraint: `diffusiongemma.Regex` or `diffusiongemma.JsonSchema`.
        tokenizer: the model's Hugging Face tokenizer.
        vocab_size: V, the model's vocabulary rows (rows beyond the tokenizer are never allowed).
        eos_ids / pad_id: the ids that end an answer (allowed only where the constraint accepts) and pad after it.
        budget: the time and memory the compilation may take (`CompileBudget`; default `budget.DEFAULT_BUDGET`,
            60 s and 4 GiB).

    Raises:
        ConstraintError: malformed regex or schema, unsupported keyword, unspellable or unsatisfiable, a tokenizer
            whose `decode` is not its tokens' text joined, or over the budget.
    """
    if tokenizer is None:
        raise ConstraintError(f"{constraint.describe()} needs the model's tokenizer: pass `tokenizer=` (in a "
                              f"pipeline: `tokenizer=pipe.tokenizer`)")
    budget = budget or DEFAULT_BUDGET
    key = (constraint, tokenizer_fingerprint(tokenizer), vocab_size, tuple(eos_ids), pad_id)
    with _LOCKS_GUARD:
        lock = _LOCKS.setdefault(key, threading.Lock())
    with lock:
        if key in _CACHE:
            _CACHE.move_to_end(key)
            return _CACHE[key]
        if (key, budget) in _REFUSED:
            raise _REFUSED[key, budget]
        try:
            automaton = build_automaton(constraint, tokenizer, vocab_size, list(eos_ids), pad_id, budget)
        except ConstraintError as error:
            remember(_REFUSED, (key, budget), error)
            raise
        remember(_CACHE, key, automaton)
    return automaton


def remember(cache: OrderedDict, key, value) -> None:
    """Put `value` in an LRU `cache` of CACHE_SIZE entries."""
    cache[key] = value
    if len(cache) > CACHE_SIZE:
        stale, _ = cache.popitem(last=False)
        with _LOCKS_GUARD:
            _LOCKS.pop(stale[0] if cache is _REFUSED else stale, None)
