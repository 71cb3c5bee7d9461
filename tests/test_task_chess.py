"""Chess: move parsing and refusal of bad answers, tablebase-verified wins, mates in 1 and 2
checked against brute force, the generator, data files, and installing the Syzygy tables."""

from __future__ import annotations

import builtins
import io
import json
import random
import tarfile

import chess
import pytest

from es_llm.errors import BadInput
from es_llm.tasks import TaskConfig, build_task, chess_tables
from es_llm.tasks import chess as chess_task
from es_llm.tasks.base import Problem
from es_llm.tasks.chess import (ChessTask, best_winning_move, checks_and_mates,
                                forces_mate_in_two, generate, load_problems, piece_list,
                                render_prompt, score_completion)

BACK_RANK = "6k1/5ppp/8/8/8/8/8/R5K1 w - - 0 1"          # Ra8# is the only mate
KQK = "8/8/8/4k3/8/8/3QK3/8 w - - 0 1"                   # white wins
KQK_STALEMATE_TRAP = "k7/2K5/8/1Q6/8/8/8/8 w - - 0 1"    # Qb6 stalemates, Qb7# mates
MATE_IN_2 = "k7/8/2K5/8/8/8/8/1R6 w - - 0 1"             # Kc7 Ka7 Ra1#; Rb7 stalemates


@pytest.fixture(scope="module")
def tablebase():
    """The installed tables, opened once here. scripts/setup.sh installs them, so missing
    tables fail the tests (with the install hint) rather than skipping them."""
    try:
        folder = chess_tables.find_tables()
    except BadInput as exc:
        pytest.fail(str(exc))
    with chess.syzygy.open_tablebase(str(folder)) as tb:
        yield tb


def _score(fen, kind, completion, **kw):
    return score_completion({"fen": fen, "kind": kind}, completion, **kw)


def _brute_mates(board):
    """Mating moves found the slow, obvious way."""
    found = []
    for move in board.legal_moves:
        board.push(move)
        if board.is_checkmate():
            found.append(move)
        board.pop()
    return found


def _leaves_a_capture(board, move):
    board.push(move)
    try:
        return any(board.generate_legal_captures())
    finally:
        board.pop()


def _brute_mate_in_two(board, move):
    """Whether ``move`` forces mate within two moves, by full-width search."""
    board.push(move)
    try:
        if board.is_checkmate():
            return True
        replies = list(board.legal_moves)
        if not replies:
            return False
        for reply in replies:
            board.push(reply)
            ok = bool(_brute_mates(board))
            board.pop()
            if not ok:
                return False
        return True
    finally:
        board.pop()


# --- parsing and scoring answers --------------------------------------------------------------

@pytest.mark.parametrize("answer", ["Ra8#", "Ra8", "Ra8+", "a1a8", "Ra1-a8", "Ra1a8#!",
                                    " Ra8 "])
def test_back_rank_mate_scores_one_in_san_and_uci(answer):
    s = _score(BACK_RANK, "mate1", f"thinking... <answer>{answer}</answer>")
    assert (s.reward, s.correct, s.format_ok, s.error) == (1.0, True, True, None)
    assert s.answer_key == s.solution_key == "a1a8"


def test_legal_but_not_mating_move_scores_zero_without_error():
    s = _score(BACK_RANK, "mate1", "<answer>Ra7</answer>")
    assert (s.reward, s.correct, s.error, s.answer_key) == (0.0, False, None, "a1a7")


@pytest.mark.parametrize("answer, error", [
    ("Rb8", "illegal move"),          # the rook on a1 cannot reach b8
    ("Qd4", "illegal move"),          # there is no queen
    ("e2e4", "illegal move"),         # nothing on e2
    ("a1a9", "unparsable move"),
    ("hello world", "unparsable move"),
    ("Ra8;import os", "unparsable move"),
    ("--", "null move"),
    ("0000", "null move"),
    ("", "no answer"),
    ("x" * 10_000, "answer too long"),
    ("__import__('os').system('rm -rf /')", "answer too long"),
    ("{{7*7}}", "unparsable move"),
    ("R\u0430" + "8", "unparsable move"),  # a Cyrillic a
])
def test_bad_answers_score_zero_with_an_error(answer, error, monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("the scorer must never evaluate model text")

    monkeypatch.setattr(builtins, "eval", forbidden)
    monkeypatch.setattr(builtins, "exec", forbidden)
    s = _score(BACK_RANK, "mate1", f"<answer>{answer}</answer>")
    assert (s.reward, s.correct) == (0.0, False)
    assert s.error.startswith(error), s.error


def test_ambiguous_san_is_refused_and_disambiguated_san_accepted():
    fen = "k7/8/8/8/8/8/7K/R6R w - - 0 1"
    assert _score(fen, "mate1", "<answer>Rd1</answer>").error == "ambiguous move"
    s = _score(fen, "mate1", "<answer>Rad1</answer>")
    assert s.error is None and s.answer_key == "a1d1"


def test_last_answer_block_wins_and_fallback_is_last_line():
    s = _score(BACK_RANK, "mate1", "<answer>Ra7</answer> no: <answer>Ra8#</answer>")
    assert s.correct and s.answer == "Ra8#"
    s = _score(BACK_RANK, "mate1", "the back rank is weak\nRa8#\n\n")
    assert s.correct and not s.format_ok and s.reward == 1.0
    s = _score(BACK_RANK, "mate1", "the back rank is weak\nRa8#", format_weight=0.1)
    assert s.reward == pytest.approx(0.9)
    wrong = _score(BACK_RANK, "mate1", "<answer>Ra7</answer>", format_weight=0.1)
    assert wrong.reward == pytest.approx(0.1)
    # With require_answer_tag only a closed tag counts (the ES paper's rule).
    assert not _score(BACK_RANK, "mate1", "weak back rank\nRa8#", require_answer_tag=True).correct
    assert _score(BACK_RANK, "mate1", "<answer>Ra8#</answer>", require_answer_tag=True).correct


def test_castling_promotion_and_en_passant_parse():
    castle = "4k3/8/8/8/8/8/8/4K2R w K - 0 1"
    for answer in ("O-O", "0-0", "e1g1"):
        assert _score(castle, "mate1", f"<answer>{answer}</answer>").answer_key == "e1g1"
    promote = "8/4P3/8/8/8/8/k7/4K3 w - - 0 1"
    for answer in ("e8=Q", "e8Q", "e7e8q", "e7e8Q"):
        assert _score(promote, "mate1", f"<answer>{answer}</answer>").answer_key == "e7e8q"
    assert _score(promote, "mate1", "<answer>e8=K</answer>").error == "illegal move"
    en_passant = "4k3/8/8/3Pp3/8/8/8/4K3 w - e6 0 1"
    for answer in ("dxe6", "d5e6"):
        assert _score(en_passant, "mate1", f"<answer>{answer}</answer>").answer_key == "d5e6"


def test_score_never_raises_on_broken_gold():
    task = build_task(TaskConfig(name="chess", tiers=(3,), num_problems=1))
    s = task.score(Problem(id="x", prompt="", gold={"fen": "not a fen", "kind": "mate1"}),
                   "<answer>e4</answer>")
    assert s.reward == 0.0 and s.error.startswith("internal error")


# --- endgames: wins verified by the tables ----------------------------------------------------

def test_kqk_winning_moves_are_exactly_those_keeping_the_queen(tablebase):
    # Black's king on e5 can take an unprotected queen on d4, d5, d6 or f4; every other
    # move keeps a won KQvK. The tables must agree square by square.
    board = chess.Board(KQK)
    hanging = {"d2d4", "d2d5", "d2d6", "d2f4"}
    for move in board.legal_moves:
        s = _score(KQK, "win", f"<answer>{board.san(move)}</answer>", tablebase=tablebase)
        assert s.correct == (move.uci() not in hanging), move.uci()
        assert s.answer_key == move.uci()
    assert _score(KQK, "win", "<answer>Qd4+</answer>", tablebase=tablebase).reward == 0.0
    assert _score(KQK, "win", "<answer>Qd7</answer>", tablebase=tablebase).reward == 1.0


def test_stalemating_move_scores_zero_and_mate_scores_one(tablebase):
    board = chess.Board(KQK_STALEMATE_TRAP)
    board.push_san("Qb6")
    assert board.is_stalemate()
    assert _score(KQK_STALEMATE_TRAP, "win", "<answer>Qb6</answer>",
                  tablebase=tablebase).reward == 0.0
    assert _score(KQK_STALEMATE_TRAP, "win", "<answer>Qb7#</answer>",
                  tablebase=tablebase).reward == 1.0
    # The reference move of a position with a mate is a mate.
    best = best_winning_move(chess.Board(KQK_STALEMATE_TRAP), tablebase)
    assert best in _brute_mates(chess.Board(KQK_STALEMATE_TRAP))


def test_reference_move_wins_avoids_hanging_pieces_and_early_stop_is_exact(tablebase):
    rng = random.Random(0)
    boards = []
    while len(boards) < 25:
        material = rng.choice(chess_task.TIER1_MATERIAL + chess_task.TIER2_MATERIAL)
        board = chess_task._random_endgame(rng, material)
        if board is not None and tablebase.probe_wdl(board) == 2:
            boards.append(board)
    for board in boards:
        fast = best_winning_move(board, tablebase)
        assert fast == best_winning_move(board, tablebase, early_stop=False)
        assert chess_task.is_winning_move(board, fast, tablebase)
        # Where some winning move leaves nothing en prise, so does the reference.
        safe = {m for m in board.legal_moves if chess_task.is_winning_move(board, m, tablebase)
                and not _leaves_a_capture(board, m)}
        assert not safe or fast in safe or fast in _brute_mates(board)


# --- mates: the fast search against brute force ------------------------------------------------

def test_checks_and_mates_match_brute_force_on_random_and_special_positions():
    special = ["r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1", "5k2/8/8/8/8/8/8/4K2R w K - 0 1",
               "8/8/8/R1pP3k/8/8/8/K7 w - c6 0 1", "7k/2P5/8/8/8/8/8/K7 w - - 0 1",
               "3k4/8/8/1B1Pp3/8/8/8/K7 w - e6 0 1", "6k1/5ppp/8/8/8/8/8/R5K1 w - - 0 1",
               "6k1/8/8/8/6B1/8/8/K5R1 w - - 0 1"]   # the last: discovered and double checks
    boards = [chess.Board(fen) for fen in special]
    rng = random.Random(1)
    while len(boards) < 600:
        board = chess.Board()
        for _ in range(rng.randrange(10, 120)):
            moves = list(board.legal_moves)
            if not moves:
                break
            board.push(rng.choice(moves))
        boards.append(board.copy(stack=False))
    with_mate = 0
    for board in boards:
        checks, mates = checks_and_mates(board)
        assert sorted(mates, key=str) == sorted(_brute_mates(board), key=str), board.fen()
        assert checks == sum(board.gives_check(m) for m in board.legal_moves), board.fen()
        with_mate += bool(mates)
    assert with_mate >= 5  # the comparison covered positions that have mates


def test_mate_in_two_hand_made():
    board = chess.Board(MATE_IN_2)
    assert not _brute_mates(board)
    solutions = [m for m in board.legal_moves if forces_mate_in_two(board, m)]
    assert solutions == [m for m in board.legal_moves if _brute_mate_in_two(board, m)]
    assert chess.Move.from_uci("c6c7") in solutions
    # Rb7 leaves Black no move and no check: stalemate, not a solution.
    assert _score(MATE_IN_2, "mate2", "<answer>Rb7</answer>").reward == 0.0
    assert _score(MATE_IN_2, "mate2", "<answer>Kc7</answer>").reward == 1.0
    assert _score(MATE_IN_2, "mate2", "<answer>Kc5</answer>").reward == 0.0
    assert chess_task.first_mate_in_two(board) == min(solutions, key=chess.Move.uci)


# --- generation -------------------------------------------------------------------------------

def test_prompt_format_and_the_docstring_example(tablebase):
    board = chess.Board(KQK)
    assert board.san(best_winning_move(board, tablebase)) == "Qd7"
    assert piece_list(board) == "white Ke2 Qd2 black Ke5"
    assert render_prompt(board, "win") == (
        "fen 8/8/8/4k3/8/8/3QK3/8 w - - 0 1\nwhite Ke2 Qd2 black Ke5\nwhite to move, win\n")
    assert render_prompt(chess.Board(BACK_RANK), "mate1").splitlines()[1:] == [
        "white Kg1 Ra1 black Kg8 Pf7 Pg7 Ph7", "white to move, mate in 1"]


def test_generate_is_deterministic_for_a_seed(tablebase):
    a = [generate(random.Random(7), tier, tablebase=tablebase) for tier in (1, 2, 3, 4)]
    b = [generate(random.Random(7), tier, tablebase=tablebase) for tier in (1, 2, 3, 4)]
    assert a == b
    assert generate(random.Random(8), 3) != a[2]


@pytest.mark.parametrize("tier, count", [(1, 15), (2, 15), (3, 15), (4, 5)])
def test_generated_puzzles_are_solved_by_their_reference(tier, count, request):
    tablebase = request.getfixturevalue("tablebase") if tier <= 2 else None
    rng = random.Random(100 + tier)
    for _ in range(count):
        problem, completion = generate(rng, tier, tablebase=tablebase)
        kind = chess_task.TIER_KINDS[tier]
        assert problem.difficulty == tier and problem.gold["kind"] == kind
        assert completion == f"<answer>{problem.meta['solution']}</answer>"
        text = problem.prompt + completion
        assert len(text) <= chess_task.MAX_TEXT_CHARS
        assert all(c == "\n" or (c.isprintable() and c.isascii()) for c in text)
        board = chess.Board(problem.gold["fen"])
        assert problem.prompt == render_prompt(board, kind)
        assert board.fen().endswith(" 0 1")
        s = score_completion(problem.gold, completion, tablebase=tablebase)
        assert (s.reward, s.correct, s.format_ok) == (1.0, True, True), (problem, s)
        move = board.parse_san(problem.meta["solution"])
        mates = _brute_mates(board)
        if tier <= 2:
            assert chess.popcount(board.occupied) == tier + 2
            assert tablebase.probe_wdl(board) == 2
        elif tier == 3:
            assert move == min(mates, key=chess.Move.uci)
        else:
            solutions = [m for m in board.legal_moves if _brute_mate_in_two(board, m)]
            assert not mates and move == min(solutions, key=chess.Move.uci)


def test_procedural_task_is_deterministic_distinct_and_covers_tiers(tablebase):
    cfg = TaskConfig(name="chess", seed=3, num_problems=24)
    with build_task(cfg) as task:
        problems = task.problems()
        again = build_task(cfg).problems()
        assert problems == again
        assert len({p.gold["fen"] for p in problems}) == 24
        assert [p.difficulty for p in problems] == [1, 2, 3, 4] * 6
        scores = task.score_many([(p, f"<answer>{p.meta['solution']}</answer>")
                                  for p in problems])
        assert all(s.correct for s in scores)
    only_mates = build_task(TaskConfig(name="chess", tiers=(3,), num_problems=5)).problems()
    assert {p.gold["kind"] for p in only_mates} == {"mate1"}


def test_tiers_are_checked():
    with pytest.raises(BadInput, match="tiers"):
        build_task(TaskConfig(name="chess", tiers=(0, 5)))


# --- files ------------------------------------------------------------------------------------

def test_records_written_by_the_testbed_load_back_and_score_the_same(tmp_path, tablebase):
    task = build_task(TaskConfig(name="chess", seed=5, num_problems=8))
    problems = task.problems()
    path = tmp_path / "heldout.jsonl"
    path.write_text("".join(json.dumps({"id": p.id, "prompt": p.prompt,
                                        "difficulty": p.difficulty, **p.gold, **p.meta}) + "\n"
                            for p in problems))
    loaded = build_task(TaskConfig(name="chess", data=str(path)))
    again = loaded.problems()
    assert again == problems
    for p, q in zip(problems, again):
        for answer in (f"<answer>{p.meta['solution']}</answer>", "Kh1", "<answer>e4"):
            assert task.score(p, answer) == loaded.score(q, answer)
        assert loaded.score(q, f"<answer>{p.meta['solution']}</answer>").correct


def test_records_without_prompt_or_difficulty(tmp_path):
    path = tmp_path / "few.jsonl"
    path.write_text(json.dumps({"fen": BACK_RANK, "kind": "mate1"}) + "\n"
                    + json.dumps({"fen": KQK, "kind": "win", "solution": "Qd7"}) + "\n")
    first, second = load_problems(path)
    assert (first.id, first.difficulty, first.prompt) == (
        "0", 3, render_prompt(chess.Board(BACK_RANK), "mate1"))
    assert (second.difficulty, second.meta) == (1, {"solution": "Qd7"})


@pytest.mark.parametrize("record, match", [
    ({"fen": "not a fen", "kind": "mate1"}, "record 1 has fen 'not a fen'"),
    ({"fen": "8/8/8/8/8/8/8/8 w - - 0 1", "kind": "mate1"}, "not a legal chess position"),
    ({"fen": BACK_RANK, "kind": "mate3"}, "record 1 has kind 'mate3'"),
    ({"fen": chess.STARTING_FEN, "kind": "win"}, "at most 4 pieces"),
    ({"kind": "mate1"}, "record 1 lacks required field"),
])
def test_bad_records_name_file_and_record(tmp_path, record, match):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"fen": BACK_RANK, "kind": "mate1"}) + "\n"
                    + json.dumps(record) + "\n")
    with pytest.raises(BadInput, match=match) as info:
        load_problems(path)
    assert "bad.jsonl" in str(info.value)


# --- the tables -------------------------------------------------------------------------------

def test_missing_tables_are_a_bad_input_at_construction(tmp_path, monkeypatch):
    monkeypatch.setenv(chess_tables.ENV_VAR, str(tmp_path / "nowhere"))
    with pytest.raises(BadInput, match="python -m es_llm.tasks.chess_tables"):
        build_task(TaskConfig(name="chess"))
    with pytest.raises(BadInput, match="ES_LLM_SYZYGY"):
        build_task(TaskConfig(name="chess", tiers=(2, 3)))
    with pytest.raises(BadInput, match="Syzygy"):
        chess_task.shared_tablebase()
    # The mate tiers need no tables.
    assert len(build_task(TaskConfig(name="chess", tiers=(3,), num_problems=2)).problems()) == 2


def test_task_opens_its_tablebase_lazily_and_close_releases_it(tablebase):
    task = ChessTask(TaskConfig(name="chess", tiers=(1,), num_problems=2))
    assert task._tb is None
    (problem, _) = task.problems()
    task.close()
    assert task._tb is None
    # Scoring after close reopens the tables.
    assert task.score(problem, f"<answer>{problem.meta['solution']}</answer>").correct
    task.close()


def test_table_names_match_the_syzygy_set():
    names = chess_tables.table_names()
    assert len(names) == 35 and len(chess_tables.expected_files()) == 70
    assert {"KQvK", "KRvK", "KPvK", "KQvKR", "KBNvK", "KPvKP", "KBvKN"} <= set(names)
    assert "KNvKB" not in names  # the stronger (or equal) side is written first


def _fake_sdist(path, names, extra=()):
    """A .tar.gz shaped like the python-chess source archive, with tiny table files."""
    with tarfile.open(path, "w:gz") as tar:
        for name in names:
            data = name.encode()
            info = tarfile.TarInfo(f"chess-9.9.9/data/syzygy/regular/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for member_name, kind in extra:
            info = tarfile.TarInfo(member_name)
            if kind == "link":
                info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
                tar.addfile(info)
            else:
                info.size = 4
                tar.addfile(info, io.BytesIO(b"evil"))
    return path


def test_install_extracts_only_the_tables_and_is_idempotent(tmp_path):
    names = chess_tables.expected_files()
    sdist = _fake_sdist(tmp_path / "chess.tar.gz", names[1:], extra=[
        ("chess-9.9.9/data/syzygy/regular/../../../../escape.rtbw", "file"),
        (f"chess-9.9.9/data/syzygy/regular/{names[0]}", "link"),
        ("chess-9.9.9/chess/__init__.py", "file"),
    ])
    dest = tmp_path / "share" / "syzygy"
    # The link is refused, so the first table is missing and nothing is installed.
    with pytest.raises(BadInput, match=f"lacks 1 Syzygy table files.*{names[0]}"):
        chess_tables.install(dest, sdist)
    assert not dest.exists() and not (tmp_path / "escape.rtbw").exists()
    good = _fake_sdist(tmp_path / "good.tar.gz", names,
                       extra=[("chess-9.9.9/data/syzygy/regular/../../../escape.rtbw", "file")])
    assert chess_tables.install(dest, good) == dest
    assert sorted(p.name for p in dest.iterdir()) == sorted(names)
    assert (dest / names[0]).read_bytes() == names[0].encode()
    assert not list(tmp_path.rglob("escape.rtbw"))
    assert [p.name for p in dest.parent.iterdir()] == ["syzygy"]  # no temporary folder left
    # Complete: nothing is read (the archive may be gone).
    assert chess_tables.install(dest, tmp_path / "gone.tar.gz") == dest


def test_install_fills_an_existing_folder_without_touching_other_files(tmp_path, monkeypatch):
    names = chess_tables.expected_files()
    dest = tmp_path / "tables"
    dest.mkdir()
    (dest / "KQRvKR.rtbw").write_bytes(b"a 5-piece table")
    (dest / names[3]).write_bytes(b"kept")
    monkeypatch.setenv(chess_tables.ENV_VAR, str(dest))
    with pytest.raises(BadInput, match="lacks 69 of their 70 files"):
        chess_tables.find_tables()
    chess_tables.main(["--sdist", str(_fake_sdist(tmp_path / "s.tar.gz", names))])
    assert chess_tables.find_tables() == dest
    assert (dest / "KQRvKR.rtbw").read_bytes() == b"a 5-piece table"
    assert (dest / names[3]).read_bytes() == b"kept"


def test_install_reports_an_unreadable_archive(tmp_path, capsys):
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(b"not a tarball")
    assert chess_tables.main(["--dest", str(tmp_path / "t"), "--sdist", str(bad)]) == 2
    assert "could not be read as a .tar.gz" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        chess_tables.main(["--help"])
    assert info.value.code == 0
