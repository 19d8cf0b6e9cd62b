"""Self-distillation on a tiny random Llama + the tiny ChatML tokenizer (seconds, no downloads)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tiny_models import chatty_config, make_chatty_model
from tiny_tokenizer import IM_END, IM_START, TINY_SYSTEM_PROMPT, make_tiny_tokenizer
from transformers import LlamaForCausalLM

from medusa_lite.commands import distill as distill_command
from medusa_lite.training import distill as self_distill

SMALL_SETTINGS = self_distill.DistillSettings(batch_size=4, max_prompt_tokens=16, max_new_tokens=6, seed=3)
NUM_SAMPLES = 10
TINY_MODEL_THREADS = 1  # a tiny model gains nothing from threads and loses a lot on a busy machine


@pytest.fixture(autouse=True, scope="module")
def single_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(TINY_MODEL_THREADS)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def tokenizer():
    return make_tiny_tokenizer()


@pytest.fixture(scope="module")
def chatty_model(tokenizer):
    return make_chatty_model(tokenizer)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tokenizer, chatty_model):
    folder = tmp_path_factory.mktemp("tiny_chat_model")
    chatty_model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def full_run(tmp_path_factory, model_dir):
    """One uninterrupted run of NUM_SAMPLES records: (output path, returned stats)."""
    out = tmp_path_factory.mktemp("full_run") / "data" / "distill.jsonl"
    return out, run_main(model_dir, out)


def run_main(model_dir: Path, out: Path, num_samples: int = NUM_SAMPLES) -> dict:
    return distill_command.main(
        [
            "--model",
            str(model_dir),
            "--dtype",
            "float32",
            "--out",
            str(out),
            "--num-samples",
            str(num_samples),
            "--batch-size",
            str(SMALL_SETTINGS.batch_size),
            "--max-prompt-tokens",
            str(SMALL_SETTINGS.max_prompt_tokens),
            "--max-new-tokens",
            str(SMALL_SETTINGS.max_new_tokens),
            "--seed",
            str(SMALL_SETTINGS.seed),
        ]
    )


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# ---------------------------------------------------------------- chat template


def test_user_turn_prefix_includes_the_default_system_turn(tokenizer):
    expected = f"{IM_START}system\n{TINY_SYSTEM_PROMPT}{IM_END}\n{IM_START}user\n"
    assert self_distill.user_turn_prefix(tokenizer) == expected
    assert self_distill.end_of_turn_ids(tokenizer) == [tokenizer.convert_tokens_to_ids(IM_END)]


def test_user_turn_prefix_of_a_template_without_system_turn():
    tokenizer = make_tiny_tokenizer()
    tokenizer.chat_template = (
        "{% for message in messages %}[{{ message['role'] }}]: {{ message['content'] }}</turn>{% endfor %}"
    )
    assert self_distill.user_turn_prefix(tokenizer) == "[user]: "
    assert self_distill.user_turn_suffix(tokenizer) == "</turn>"


def test_tokenizer_without_chat_template_is_refused():
    tokenizer = make_tiny_tokenizer()
    tokenizer.chat_template = None
    with pytest.raises(ValueError, match="chat template"):
        self_distill.user_turn_prefix(tokenizer)


def test_prompt_ids_round_trip_through_the_template(tokenizer):
    ids = self_distill.chat_prompt_ids(tokenizer, "Why is the sky blue?")
    text = tokenizer.decode(ids)
    assert text.startswith(self_distill.user_turn_prefix(tokenizer) + "Why is the sky blue?")
    assert text.endswith(f"{IM_START}assistant\n")


# ---------------------------------------------------------------- sampling pieces


def test_nucleus_probs_keeps_the_smallest_top_set():
    logits = torch.tensor([[0.5, 0.05, 0.3, 0.15]]).log()
    probs = self_distill.nucleus_probs(logits, temperature=1.0, top_p=0.8)
    torch.testing.assert_close(probs, torch.tensor([[0.625, 0.0, 0.375, 0.0]]))


def test_question_filter():
    assert self_distill.is_acceptable_question("What is the capital of France?")
    for bad in ["", "   ", "Hello there", "the the the the the the", "What is \ufffd here?"]:
        assert not self_distill.is_acceptable_question(bad), bad


def test_sampled_tokens_depend_on_the_record_seed_not_the_batch(tokenizer, chatty_model):
    prompt = tokenizer("Write a short poem", add_special_tokens=False).input_ids
    stop_ids, pad_id = self_distill.end_of_turn_ids(tokenizer), tokenizer.pad_token_id

    def sample(seeds):
        generators = self_distill.seeded_generators(seeds, torch.device("cpu"))
        sampler = self_distill.PerRowSampler(generators, temperature=1.0, top_p=0.95)
        return self_distill.generate_batch(chatty_model, [prompt] * len(seeds), 12, stop_ids, pad_id, sampler)

    alone = sample([11])[0]
    in_batch = sample([5, 11, 7])
    assert in_batch[1] == alone
    assert in_batch[0] != in_batch[2]  # different seeds, different samples


def test_left_padded_batch_matches_one_by_one(tokenizer):
    torch.manual_seed(1)
    model = LlamaForCausalLM(chatty_config(tokenizer)).eval()
    prompts = [self_distill.chat_prompt_ids(tokenizer, q) for q in ["Hi", "How do birds know where to go?"]]
    stop_ids, pad_id = self_distill.end_of_turn_ids(tokenizer), tokenizer.pad_token_id
    batched = self_distill.generate_batch(model, prompts, 10, stop_ids, pad_id)
    singles = [self_distill.generate_batch(model, [prompt], 10, stop_ids, pad_id)[0] for prompt in prompts]
    assert batched == singles
    assert all(len(output.tokens) > 0 for output in batched)


def test_seen_questions_are_resampled(tokenizer, chatty_model):
    first = self_distill.sample_questions(chatty_model, tokenizer, [0], SMALL_SETTINGS, set())
    assert set(first) == {0}
    seen = {self_distill.normalize_question(first[0])}
    second = self_distill.sample_questions(chatty_model, tokenizer, [0], SMALL_SETTINGS, seen)
    assert second[0] != first[0]
    assert self_distill.normalize_question(second[0]) in seen  # the new one was added


# ---------------------------------------------------------------- the script


def test_main_writes_sharegpt_jsonl(full_run):
    out, stats = full_run
    records = read_lines(out)
    assert stats["records"] == NUM_SAMPLES
    assert [record["id"] for record in records] == list(range(NUM_SAMPLES))
    questions = [record["conversations"][0]["value"] for record in records]
    assert len({self_distill.normalize_question(q) for q in questions}) == NUM_SAMPLES
    for record in records:
        assert record["source"] == "self-distill"
        assert isinstance(record["truncated"], bool)
        human, gpt = record["conversations"]
        assert (human["from"], gpt["from"]) == ("human", "gpt")
        assert self_distill.is_acceptable_question(human["value"])
        assert IM_START not in human["value"] and IM_END not in gpt["value"]
    assert any(record["conversations"][1]["value"] for record in records)
    assert (out.parent / (out.name + self_distill.SETTINGS_SUFFIX)).is_file()


def test_answers_match_the_model_on_each_question_alone(full_run, tokenizer, chatty_model):
    for record in read_lines(full_run[0])[: SMALL_SETTINGS.batch_size]:
        question = record["conversations"][0]["value"]
        answer = self_distill.answer_questions(chatty_model, tokenizer, {0: question}, SMALL_SETTINGS)[0]
        assert record["conversations"][1]["value"] == tokenizer.decode(answer.tokens, skip_special_tokens=True)
        assert record["truncated"] == (not answer.finished)


def test_resume_after_a_kill_matches_an_uninterrupted_run(tmp_path, model_dir, full_run):
    full = full_run[0]
    lines = full.read_text().splitlines(keepends=True)
    killed = tmp_path / "killed.jsonl"
    kept_lines = SMALL_SETTINGS.batch_size + 1  # mid-batch, plus a torn line
    killed.write_text("".join(lines[:kept_lines]) + lines[kept_lines][: len(lines[kept_lines]) // 2])
    stats = run_main(model_dir, killed)
    assert stats["records"] == NUM_SAMPLES - kept_lines
    assert killed.read_text() == full.read_text()


def test_extending_a_finished_run_matches_one_longer_run(tmp_path, model_dir, full_run):
    full = full_run[0]
    grown = tmp_path / "grown.jsonl"
    run_main(model_dir, grown, num_samples=NUM_SAMPLES // 2)
    assert run_main(model_dir, grown)["records"] == NUM_SAMPLES - NUM_SAMPLES // 2
    assert grown.read_text() == full.read_text()


def test_resume_with_other_settings_is_refused(tmp_path, model_dir):
    out = tmp_path / "distill.jsonl"
    run_main(model_dir, out, num_samples=2)
    with pytest.raises(SystemExit, match="other settings"):
        distill_command.main(
            [
                "--model",
                str(model_dir),
                "--dtype",
                "float32",
                "--out",
                str(out),
                "--num-samples",
                "2",
                "--max-new-tokens",
                "5",
            ]
        )


# ---------------------------------------------------------------- task openers


def test_openers_are_used_in_turn():
    openers = ("A: ", "B: ", "C: ")
    assert [self_distill.opener_for(i, openers) for i in range(5)] == ["A: ", "B: ", "C: ", "A: ", "B: "]
    assert self_distill.opener_for(7, ()) == ""


def test_questions_start_with_their_opener_and_the_model_writes_the_rest(tokenizer, chatty_model):
    openers = ("Summarize the following text:\n\n", "Solve this: ")
    settings = SMALL_SETTINGS.__class__(**{**SMALL_SETTINGS.__dict__, "task_openers": openers})
    questions = self_distill.sample_questions(chatty_model, tokenizer, [0, 1, 2], settings, set())
    assert set(questions) == {0, 1, 2}
    for index, question in questions.items():
        opener = openers[index % len(openers)].strip()
        assert question.startswith(opener) and len(question) > len(opener), question


def test_opener_file_and_resume_check(tmp_path, model_dir):
    openers_file = tmp_path / "openers.txt"
    openers_file.write_text("Summarize this:\\n\\n\n\nTranslate: \n")
    assert distill_command.read_task_openers(str(openers_file)) == ("Summarize this:\n\n", "Translate: ")
    assert distill_command.read_task_openers("default") == self_distill.TASK_OPENERS
    with pytest.raises(SystemExit, match="neither"):
        distill_command.read_task_openers(str(tmp_path / "missing.txt"))
    out = tmp_path / "tasks.jsonl"

    def argv(num_samples: int, openers: str) -> list[str]:
        return [
            "--model",
            str(model_dir),
            "--dtype",
            "float32",
            "--out",
            str(out),
            "--num-samples",
            str(num_samples),
            "--batch-size",
            "2",
            "--max-new-tokens",
            "4",
            "--task-openers",
            openers,
        ]

    distill_command.main(argv(2, str(openers_file)))
    questions = [record["conversations"][0]["value"] for record in read_lines(out)]
    assert questions[0].startswith("Summarize this:") and questions[1].startswith("Translate:")
    distill_command.main(argv(3, str(openers_file)))  # the same openers: resumes
    assert len(read_lines(out)) == 3 and read_lines(out)[2]["conversations"][0]["value"].startswith("Summarize this:")
    with pytest.raises(SystemExit, match="other settings"):
        distill_command.main(argv(4, "default"))
