"""Chess: play a winning move in a small endgame, or find a mate in 1 or 2.

Tiers (``task.tiers``; default all four):

1. 3-piece endgames (KQvK, KRvK, KPvK), the stronger side to move and winning: Syzygy WDL 2,
   a win the 50-move rule does not spoil. Task: a winning move.
2. The same with 4 pieces where the stronger side usually wins: KQvKR, KQvKB, KQvKN,
   KQvKP, KRvKP, KQQvK, KQRvK, KRRvK, KQPvK, KRPvK, KBNvK, KBBvK, KPPvK.
3. Mate in 1 in a position reached by random legal play; any mating move is accepted (the
   Lichess rule).
4. Mate in 2 in a position from random play with no mate in 1: any first move after which
   every legal reply allows a mate in 1 is accepted. Only positions with at least two
   checking moves and an enemy king with at most three free neighbouring squares are
   searched (about 3/4 of the mates in 2, under 1/7 of the positions), so the tier leans
   toward boxed-in kings.

Endgames place the pieces at random (pawns on ranks 2-7, the stronger side either colour).
Random play (tiers 3-4) starts from the initial position and plays a capture, when there is
one, with probability 1/2, so the board thins fast: positions fit the length budget and
mates come sooner. FENs get clocks ``0 1`` (the tables assume a fresh 50-move count).

Verification: in tiers 1-2 a move wins iff it is legal and mates, or leaves the opponent
WDL -2 (a loss not cursed by the 50-move rule); a move giving up the win scores 0. Tiers
3-4 are checked by search with python-chess (no engine). The tables
(``es_llm.tasks.chess_tables``) are opened lazily, per process and per task instance.

Format (printable ASCII; generated prompt + completion at most 200 characters): the FEN, the
pieces of each side (K, Q, R, B, N, then pawns as P; squares in a1..h8 order), the goal;
the completion is the move in SAN in answer tags::

    prompt      "fen 8/8/8/4k3/8/8/3QK3/8 w - - 0 1\\nwhite Ke2 Qd2 black Ke5\\n"
                "white to move, win\\n"
    completion  "<answer>Qd7</answer>"

    prompt      "fen 6k1/5ppp/8/8/8/8/8/R5K1 w - - 0 1\\nwhite Kg1 Ra1 black Kg8 Pf7 Pg7 "
                "Ph7\\nwhite to move, mate in 1\\n"
    completion  "<answer>Ra8#</answer>"

Reference moves (first in UCI order among equals, so a pure function of the position):
tiers 1-2 the quickest win by DTZ among moves leaving the opponent nothing to capture (see
``best_winning_move``), tier 3 a mate, tier 4 a first move that forces mate.

Answers: the last ``<answer>...</answer>`` block (format_ok), else the last non-empty line;
UCI (``e2e4``, ``e7e8q``) or SAN (``Qd4+``, ``exd5``, ``O-O``, ``0-0``, ``Ng1-f3``) of at
most 16 characters, ``+ # ! ?`` ignored. Illegal, ambiguous or unparsable answers score 0
with an error. ``answer_key`` and ``solution_key`` are the move in UCI.

Generation speed (``generate`` in a loop on one core of a busy machine, python-chess 1.11):
tier 1 about 125 puzzles/s, tier 2 about 100/s, tier 3 about 65/s, tier 4 about 18/s. Tiers
1-2 spend their time in DTZ probes (python-chess decodes them in pure Python), tiers 3-4 in
move generation, which ``_check_candidates`` keeps to the moves that can give check.
"""

from __future__ import annotations

import functools
import random
import re

import chess
import chess.syzygy

from es_llm.errors import BadInput
from es_llm.tasks.base import (MAX_COMPLETION_CHARS, InProcessTask, Problem, Score,
                               too_long)
from es_llm.tasks.countdown import extract_answer
from es_llm.tasks.loading import load_records, record_id, row_messages
from es_llm.tasks.registry import (TaskConfig, check_tiers, choose_rows, combine_reward,
                                   data_path, distinct_problems, read_limit, register_task)

TIER_KINDS = {1: "win", 2: "win", 3: "mate1", 4: "mate2"}
TIERS = tuple(TIER_KINDS)
GOALS = {"win": "win", "mate1": "mate in 1", "mate2": "mate in 2"}
TIER1_MATERIAL = ("KQvK", "KRvK", "KPvK")
TIER2_MATERIAL = ("KQvKR", "KQvKB", "KQvKN", "KQvKP", "KRvKP", "KQQvK", "KQRvK", "KRRvK",
                  "KQPvK", "KRPvK", "KBNvK", "KBBvK", "KPPvK")
# The testbed's character-level models see prompt + completion within this many characters.
MAX_TEXT_CHARS = 200
# Random play (tiers 3-4): the chance of a capture when there is one, and when a game is
# given up; of the settings measured, these gave the most mates per second that fit.
CAPTURE_BIAS = 0.5
MAX_PLIES = 200
MIN_PLAY_PIECES = 6
# Tier 4 searches only positions with this many checks and at most this many enemy king
# flight squares. Measured on random play: fewer checks hold 70% of the positions but 7% of
# the mates in 2; of the rest, more flights hold 65% of the positions, 20% of the mates.
MIN_CHECKS_MATE2 = 2
MAX_FLIGHTS_MATE2 = 3
# More pieces cannot fit MAX_TEXT_CHARS (4 characters each in the list, 1-2 in the FEN).
MAX_MATE_PIECES = 20
MAX_ANSWER_CHARS = 16

_ANNOTATION = str.maketrans("", "", "+#!?")
_MOVE_CHARS_RE = re.compile(r"[A-Za-z0-9=\-]{2,12}")
_UCI_RE = re.compile(r"[a-h][1-8][a-h][1-8][qrbnQRBN]?")
_PIECE_ORDER = (chess.KING, chess.QUEEN, chess.ROOK, chess.BISHOP, chess.KNIGHT, chess.PAWN)
_PAWN_SQUARES = tuple(range(chess.A2, chess.H7 + 1))


class _Rejected(Exception):
    """An answer that is not a legal move; the message is the Score error."""


# ---------------------------------------------------------------------------------------------
# Tablebase
# ---------------------------------------------------------------------------------------------

def _tables():
    # Imported on use, not with the package: ``python -m es_llm.tasks.chess_tables`` runs
    # that module as a script, which must not be imported before (runpy warns).
    from es_llm.tasks import chess_tables

    return chess_tables


@functools.cache
def _open_shared(folder: str) -> chess.syzygy.Tablebase:
    _tables().find_tables()
    return chess.syzygy.open_tablebase(folder)


def shared_tablebase() -> chess.syzygy.Tablebase:
    """The tables of ``chess_tables.default_dir()``, opened once per process and folder (so
    millions of ``generate`` calls share them); BadInput if they are not installed."""
    return _open_shared(str(_tables().default_dir()))


# ---------------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------------

def piece_list(board: chess.Board) -> str:
    """The pieces of each side, e.g. ``"white Ke2 Qd2 Pa2 black Ke5"``."""
    parts = []
    for color in (chess.WHITE, chess.BLACK):
        parts.append(chess.COLOR_NAMES[color])
        for piece_type in _PIECE_ORDER:
            letter = chess.piece_symbol(piece_type).upper()
            parts.extend(letter + chess.square_name(sq) for sq in board.pieces(piece_type, color))
    return " ".join(parts)


def render_prompt(board: chess.Board, kind: str) -> str:
    """The compact prompt: FEN line, piece list line, side to move and goal line."""
    side = chess.COLOR_NAMES[board.turn]
    return f"fen {board.fen()}\n{piece_list(board)}\n{side} to move, {GOALS[kind]}\n"


def render_completion(san: str) -> str:
    """The worked solution: the move in SAN inside answer tags."""
    return f"<answer>{san}</answer>"


# ---------------------------------------------------------------------------------------------
# Search: checks, mates, tablebase wins
# ---------------------------------------------------------------------------------------------

def _check_squares(board: chess.Board) -> tuple[list[int], int]:
    """``targets``: per piece type, the squares from which a piece of the side to move would
    attack the enemy king (current occupancy); ``uncover``: our pieces that alone stand
    between that king and one of our sliders. A piece never checks through the square it
    leaves (it would be giving check already), so these cover all checks but the special
    moves ``_check_candidates`` adds."""
    us, occupied = board.turn, board.occupied
    king = board.king(not us)
    ours = board.occupied_co[us]
    diagonal = chess.BB_DIAG_ATTACKS[king][chess.BB_DIAG_MASKS[king] & occupied]
    straight = (chess.BB_RANK_ATTACKS[king][chess.BB_RANK_MASKS[king] & occupied]
                | chess.BB_FILE_ATTACKS[king][chess.BB_FILE_MASKS[king] & occupied])
    targets = [0, chess.BB_PAWN_ATTACKS[not us][king], chess.BB_KNIGHT_ATTACKS[king],
               diagonal, straight, diagonal | straight, 0]
    snipers = ours & (((board.rooks | board.queens)
                       & (chess.BB_RANK_ATTACKS[king][0] | chess.BB_FILE_ATTACKS[king][0]))
                      | ((board.bishops | board.queens) & chess.BB_DIAG_ATTACKS[king][0]))
    uncover = 0
    for sniper in chess.scan_reversed(snipers):
        blockers = chess.between(king, sniper) & occupied
        if blockers and not blockers & (blockers - 1) and blockers & ours:
            uncover |= blockers
    return targets, uncover


def _check_candidates(board: chess.Board):
    """Pseudo-legal moves that may give check, a superset of the checks, in disjoint groups:
    uncovering pieces and promoting pawns anywhere; other pawns to their check squares or
    en passant (which can uncover a check along the rank); pieces to their check squares;
    the king only by castling. Most moves are never generated; pseudo-legal generation
    skips python-chess's pin analysis (the caller drops moves into check)."""
    targets, uncover = _check_squares(board)
    us = board.turn
    rest = board.occupied_co[us] & ~uncover
    pseudo = board.generate_pseudo_legal_moves
    if uncover:
        yield from pseudo(uncover)
    pawns = board.pawns & rest
    promoting = pawns & (chess.BB_RANK_7 if us == chess.WHITE else chess.BB_RANK_2)
    if promoting:
        yield from pseudo(promoting)
    en_passant = chess.BB_SQUARES[board.ep_square] if board.ep_square is not None else 0
    if pawns & ~promoting:
        yield from pseudo(pawns & ~promoting, targets[chess.PAWN] | en_passant)
    for piece_type in (chess.KNIGHT, chess.BISHOP, chess.ROOK, chess.QUEEN):
        pieces = board.pieces_mask(piece_type, us) & rest
        if pieces and targets[piece_type]:
            yield from pseudo(pieces, targets[piece_type])
    rooks = board.clean_castling_rights() & board.occupied_co[us]
    if rooks and board.kings & rest:
        # python-chess generates castling only where it is legal.
        yield from pseudo(board.kings & rest, rooks)


def _mates(board: chess.Board, move: chess.Move) -> bool:
    """Whether the legal ``move`` checkmates."""
    board.push(move)
    try:
        return board.is_check() and not any(board.generate_legal_moves())
    finally:
        board.pop()


def checks_and_mates(board: chess.Board, first_mate_only: bool = False
                     ) -> tuple[int, list[chess.Move]]:
    """How many legal moves give check, and those that mate (any order; with
    ``first_mate_only``, up to the first). Only candidate checks are played out."""
    checks, mates = 0, []
    for move in _check_candidates(board):
        board.push(move)
        try:
            # was_into_check: the move left the mover's own king attacked, so it is illegal.
            if board.is_check() and not board.was_into_check():
                checks += 1
                if not any(board.generate_legal_moves()):
                    mates.append(move)
                    if first_mate_only:
                        break
        finally:
            board.pop()
    return checks, mates


def has_mate_in_one(board: chess.Board) -> bool:
    """Whether the side to move has a mating move."""
    return bool(checks_and_mates(board, first_mate_only=True)[1])


def _escapes(board: chess.Board, reply: chess.Move) -> bool:
    """Whether after the legal ``reply`` the side that moved before it has no mate in 1."""
    board.push(reply)
    try:
        return not has_mate_in_one(board)
    finally:
        board.pop()


def forces_mate_in_two(board: chess.Board, move: chess.Move,
                       killers: list[chess.Move] | None = None) -> bool:
    """Whether the legal ``move`` mates or leaves every legal reply a mate in 1 (stalemate
    is no solution). ``killers`` (updated in place) are replies that refuted other first
    moves here; tried before the replies are generated, they end most failures at once."""
    killers = [] if killers is None else killers
    board.push(move)
    try:
        for killer in killers:
            if board.is_legal(killer) and _escapes(board, killer):
                return False
        replies = list(board.generate_legal_moves())
        if not replies:
            return board.is_check()
        for reply in replies:
            if reply not in killers and _escapes(board, reply):
                killers.insert(0, reply)
                del killers[3:]
                return False
        return True
    finally:
        board.pop()


def first_mate_in_two(board: chess.Board) -> chess.Move | None:
    """The first move in UCI order that forces mate in 2, if any (no mate in 1 assumed)."""
    killers: list[chess.Move] = []
    for move in sorted(board.generate_legal_moves(), key=chess.Move.uci):
        if forces_mate_in_two(board, move, killers):
            return move
    return None


def is_winning_move(board: chess.Board, move: chess.Move,
                    tablebase: chess.syzygy.Tablebase) -> bool:
    """Whether the legal ``move`` mates or leaves the opponent a tablebase loss (WDL -2)."""
    board.push(move)
    try:
        if board.is_checkmate():
            return True
        return tablebase.probe_wdl(board) == -2
    finally:
        board.pop()


def best_winning_move(board: chess.Board, tablebase: chess.syzygy.Tablebase,
                      early_stop: bool = True) -> chess.Move | None:
    """The reference winning move, None if no move wins.

    Winning moves (leaving the opponent WDL -2) are tried in classes: a mate; a capture or
    pawn move leaving the opponent nothing to capture; a quiet move leaving nothing to
    capture; any other. Within a class, the least DTZ left to the opponent, ties to the
    first in UCI order. DTZ alone would favour hanging a spare piece (the loser's capture
    resets DTZ too), hence the classes. DTZ probes are the cost, so only the deciding class
    is probed, and quiet moves stop at one achieving the root's DTZ, which none can beat.
    """
    mates = checks_and_mates(board)[1]
    if mates:
        return min(mates, key=chess.Move.uci)
    classes: tuple[list, list, list] = ([], [], [])
    for move in sorted(board.generate_legal_moves(), key=chess.Move.uci):
        zeroing = board.is_zeroing(move)
        board.push(move)
        try:
            if tablebase.probe_wdl(board) != -2:
                continue
            safe = not any(board.generate_legal_captures())
        finally:
            board.pop()
        classes[0 if zeroing and safe else 1 if safe else 2].append(move)
    for i, moves in enumerate(classes):
        if moves:
            stop_at = tablebase.probe_dtz(board) - 1 if i == 1 and early_stop else None
            return _least_dtz(board, moves, tablebase, stop_at)
    return None


def _least_dtz(board: chess.Board, moves: list[chess.Move], tablebase: chess.syzygy.Tablebase,
               stop_at: int | None) -> chess.Move:
    """The first of the winning ``moves`` leaving the least DTZ (at once if ``stop_at``)."""
    best, best_dtz = moves[0], None
    for move in moves:
        board.push(move)
        try:
            dtz = abs(tablebase.probe_dtz(board))
        finally:
            board.pop()
        if dtz == stop_at:
            return move
        if best_dtz is None or dtz < best_dtz:
            best, best_dtz = move, dtz
    return best


# ---------------------------------------------------------------------------------------------
# Generation
# ---------------------------------------------------------------------------------------------

def _random_endgame(rng: random.Random, material: str) -> chess.Board | None:
    """A random placement of ``material`` (e.g. ``"KRPvK"``), stronger side to move; None
    when the placement is illegal (adjacent kings, the side not to move in check)."""
    strong, weak = material[1:].split("vK")
    strong_color = rng.random() < 0.5
    pieces = [(chess.KING, strong_color), (chess.KING, not strong_color)]
    pieces += [(chess.PIECE_SYMBOLS.index(p.lower()), strong_color) for p in strong]
    pieces += [(chess.PIECE_SYMBOLS.index(p.lower()), not strong_color) for p in weak]
    board = chess.Board(None)
    board.turn = strong_color
    used: set[int] = set()
    for piece_type, color in pieces:
        pool = _PAWN_SQUARES if piece_type == chess.PAWN else range(64)
        square = rng.choice(pool)
        while square in used:
            square = rng.choice(pool)
        used.add(square)
        board.set_piece_at(square, chess.Piece(piece_type, color))
    return board if board.is_valid() else None


def _endgame_puzzle(rng: random.Random, tier: int,
                    tablebase: chess.syzygy.Tablebase) -> tuple[chess.Board, chess.Move]:
    materials = TIER1_MATERIAL if tier == 1 else TIER2_MATERIAL
    while True:
        board = _random_endgame(rng, rng.choice(materials))
        # The root probe is a cheap filter: most draws are dropped before the move search.
        if board is None or tablebase.probe_wdl(board) != 2:
            continue
        move = best_winning_move(board, tablebase)
        if move is not None:
            return board, move


def _pick_legal(rng: random.Random, board: chess.Board,
                moves: list[chess.Move]) -> chess.Move | None:
    """A uniform random legal move of the pseudo-legal ``moves`` (None if none is legal):
    rejecting draws is cheaper than checking every move for pins, and stays uniform."""
    while moves:
        i = rng.randrange(len(moves))
        if not board.is_into_check(moves[i]):
            return moves[i]
        moves[i] = moves[-1]
        moves.pop()
    return None


def _random_play(rng: random.Random):
    """The positions of one random game biased toward captures (one board, mutated), until
    it ends, drops below ``MIN_PLAY_PIECES`` (mates grow rare) or reaches ``MAX_PLIES``."""
    board = chess.Board()
    for _ in range(MAX_PLIES):
        move = None
        if rng.random() < CAPTURE_BIAS:
            move = _pick_legal(rng, board, list(board.generate_pseudo_legal_captures()))
        if move is None:
            move = _pick_legal(rng, board, list(board.generate_pseudo_legal_moves()))
        if move is None:
            return
        board.push(move)
        if chess.popcount(board.occupied) < MIN_PLAY_PIECES:
            return
        yield board


def _flight_squares(board: chess.Board) -> int:
    """How many squares next to the enemy king are neither its own pieces' nor attacked."""
    enemy = not board.turn
    king = board.king(enemy)
    free = chess.BB_KING_ATTACKS[king] & ~board.occupied_co[enemy]
    return sum(not board.is_attacked_by(board.turn, sq) for sq in chess.scan_reversed(free))


def _fits(board: chess.Board, kind: str, san: str) -> bool:
    return len(render_prompt(board, kind)) + len(render_completion(san)) <= MAX_TEXT_CHARS


def _mate_puzzle(rng: random.Random, tier: int) -> tuple[chess.Board, chess.Move]:
    kind = TIER_KINDS[tier]
    while True:
        for board in _random_play(rng):
            if chess.popcount(board.occupied) > MAX_MATE_PIECES:
                continue
            checks, mates = checks_and_mates(board)
            if tier == 3:
                move = min(mates, key=chess.Move.uci) if mates else None
            elif (mates or checks < MIN_CHECKS_MATE2
                  or _flight_squares(board) > MAX_FLIGHTS_MATE2):
                move = None
            else:
                move = first_mate_in_two(board)
            if move is None:
                continue
            found = board.copy(stack=False)
            found.halfmove_clock, found.fullmove_number = 0, 1
            if _fits(found, kind, found.san(move)):
                return found, move


def generate(rng: random.Random, tier: int, *,
             tablebase: chess.syzygy.Tablebase | None = None) -> tuple[Problem, str]:
    """A random puzzle of ``tier`` (1-4) and its completion; a pure function of ``rng``'s
    state. Tiers 1-2 probe ``tablebase`` (default ``shared_tablebase()``)."""
    if tier not in TIER_KINDS:
        raise ValueError(f"chess tiers are 1-4, got {tier}")
    kind = TIER_KINDS[tier]
    if kind == "win":
        board, move = _endgame_puzzle(rng, tier, tablebase or shared_tablebase())
    else:
        board, move = _mate_puzzle(rng, tier)
    san = board.san(move)
    fen = board.fen()
    problem = Problem(id=f"chess-{kind}-{fen.replace(' ', '_')}",
                      prompt=render_prompt(board, kind), gold={"fen": fen, "kind": kind},
                      difficulty=tier, meta={"solution": san})
    return problem, render_completion(san)


# ---------------------------------------------------------------------------------------------
# Scoring
# ---------------------------------------------------------------------------------------------

def parse_move(board: chess.Board, text: str, max_chars: int = MAX_ANSWER_CHARS) -> chess.Move:
    """The legal move ``text`` names in UCI or SAN (``+ # ! ?`` dropped, no null move);
    raises ``_Rejected`` with the reason."""
    if len(text) > max_chars:
        raise _Rejected(f"answer too long ({len(text)} chars > {max_chars})")
    move_text = text.translate(_ANNOTATION).strip()
    if not _MOVE_CHARS_RE.fullmatch(move_text):
        raise _Rejected("unparsable move")
    try:
        if _UCI_RE.fullmatch(move_text):
            move = board.parse_uci(move_text[:4] + move_text[4:].lower())
        else:
            move = board.parse_san(move_text)
    except chess.AmbiguousMoveError:
        raise _Rejected("ambiguous move") from None
    except chess.IllegalMoveError:
        raise _Rejected("illegal move") from None
    except ValueError:
        raise _Rejected("unparsable move") from None
    if not move:
        raise _Rejected("null move")
    return move


def is_correct(board: chess.Board, kind: str, move: chess.Move,
               tablebase: chess.syzygy.Tablebase | None) -> bool:
    """Whether the legal ``move`` solves the puzzle of ``kind`` in ``board``."""
    if kind == "mate1":
        return _mates(board, move)
    if kind == "mate2":
        return forces_mate_in_two(board, move)
    return is_winning_move(board, move, tablebase or shared_tablebase())


def score_completion(gold: dict, completion: str, *, format_weight: float = 0.0,
                     tablebase: chess.syzygy.Tablebase | None = None,
                     max_chars: int = MAX_ANSWER_CHARS, require_answer_tag: bool = False,
                     max_completion_chars: int = MAX_COMPLETION_CHARS) -> Score:
    """Score a completion of the puzzle ``gold`` (``{"fen", "kind"}``); ``tablebase`` serves
    ``win`` puzzles (default ``shared_tablebase()``). Bad answers: reward 0 and an error;
    ``require_answer_tag``: only an answer inside ``<answer>`` tags counts."""
    refused = too_long(completion, max_completion_chars)
    if refused is not None:
        return refused
    text, format_ok = extract_answer(completion, require_answer_tag)
    failed = {"reward": combine_reward(False, format_ok, format_weight), "correct": False,
              "answer": text, "format_ok": format_ok}
    if not text:
        return Score(error="no answer", **failed)
    board = chess.Board(gold["fen"])
    try:
        move = parse_move(board, text, max_chars)
    except _Rejected as exc:
        return Score(error=str(exc), **failed)
    correct = is_correct(board, gold["kind"], move, tablebase)
    uci = move.uci()
    return Score(reward=combine_reward(correct, format_ok, format_weight), correct=correct,
                 answer=text, format_ok=format_ok, answer_key=uci, solution_key=uci)


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------

def _board_of(rec: dict, path, index: int) -> chess.Board:
    fen, kind = rec["fen"], rec["kind"]
    if kind not in GOALS:
        raise BadInput(f"data file {str(path)!r}: record {index} has kind {kind!r}; the kind "
                       f"must be one of {', '.join(GOALS)}.")
    try:
        board = chess.Board(fen) if isinstance(fen, str) else None
    except ValueError:
        board = None
    if board is None or not board.is_valid():
        raise BadInput(f"data file {str(path)!r}: record {index} has fen {fen!r}, which is "
                       f"not a legal chess position; give a FEN string such as "
                       f"{chess.STARTING_FEN!r}.")
    if kind == "win" and (chess.popcount(board.occupied) > 4 or board.castling_rights):
        raise BadInput(f"data file {str(path)!r}: record {index} is a 'win' puzzle with "
                       f"fen {fen!r}; 'win' puzzles are checked with the 3-4-piece Syzygy "
                       f"tables, so they need at most 4 pieces and no castling rights.")
    return board


def load_problems(path, limit: int | None = None) -> list[Problem]:
    """Chess problems from a file with ``fen, kind`` and optional ``id, prompt, difficulty,
    solution, reference`` (as the testbed writes held-out sets). The prompt defaults to
    ``render_prompt``, the difficulty to the kind's tier (win: 1 for 3 pieces, 2 for 4)."""
    records = load_records(path, {"fen": ("fen",), "kind": ("kind",)}, limit)
    problems = []
    for i, rec in enumerate(records):
        board = _board_of(rec, path, i)
        kind = rec["kind"]
        tier = {"mate1": 3, "mate2": 4}.get(kind, chess.popcount(board.occupied) - 2)
        difficulty = rec.get("difficulty")
        meta = {k: rec[k] for k in ("solution", "reference") if rec.get(k) is not None}
        problems.append(Problem(id=record_id(rec, i),
                                prompt=rec.get("prompt") or render_prompt(board, kind),
                                gold={"fen": rec["fen"], "kind": kind},
                                difficulty=tier if difficulty is None else int(difficulty),
                                meta=meta, messages=row_messages(rec, path, i)))
    return problems


# ---------------------------------------------------------------------------------------------
# The task
# ---------------------------------------------------------------------------------------------

class ChessTask(InProcessTask):
    """Chess puzzles (generated or from a file), verified with Syzygy tables and search."""

    name = "chess"

    def __init__(self, cfg: TaskConfig, *, max_answer_chars: int = MAX_ANSWER_CHARS):
        tiers = cfg.tiers or TIERS
        check_tiers("chess", tiers, 1, len(TIERS))
        if cfg.data is None and any(TIER_KINDS[t] == "win" for t in tiers):
            _tables().find_tables()  # fail now, with how to install, not mid-run
        self.cfg, self._tiers, self._max_chars = cfg, tiers, max_answer_chars
        self._problems: list[Problem] | None = None
        self._tb: chess.syzygy.Tablebase | None = None

    def _tablebase(self) -> chess.syzygy.Tablebase:
        if self._tb is None:
            self._tb = chess.syzygy.open_tablebase(str(_tables().find_tables()))
        return self._tb

    def _generate(self, rng: random.Random, tier: int) -> tuple[Problem, str]:
        tablebase = self._tablebase() if TIER_KINDS[tier] == "win" else None
        return generate(rng, tier, tablebase=tablebase)

    def problems(self) -> list[Problem]:
        """The task's problems (loaded or generated once, then reused)."""
        if self._problems is None:
            if self.cfg.data is not None:
                loaded = choose_rows(
                    load_problems(data_path(self.cfg), read_limit(self.cfg)), self.cfg)
                if any(p.gold["kind"] == "win" for p in loaded):
                    _tables().find_tables()
                self._problems = loaded
            else:
                made = distinct_problems(self._generate, lambda p: p.gold["fen"], self.cfg,
                                         self._tiers)
                self._problems = choose_rows(made, self.cfg)
        return list(self._problems)

    def _score(self, problem: Problem, completion: str) -> Score:
        tablebase = self._tablebase() if problem.gold["kind"] == "win" else None
        return score_completion(problem.gold, completion, format_weight=self.cfg.format_weight,
                                tablebase=tablebase, max_chars=self._max_chars,
                                require_answer_tag=self.cfg.require_answer_tag,
                                max_completion_chars=self.cfg.max_completion_chars)

    def close(self) -> None:
        """Close the task's tablebase files (reopened if the task is used again)."""
        if self._tb is not None:
            self._tb.close()
            self._tb = None


@register_task("chess", answer_tag=True)
def _build(cfg: TaskConfig) -> ChessTask:
    return ChessTask(cfg)
