"""A tiny ChatML tokenizer built offline, for unit tests on tiny random models.

``make_tiny_tokenizer()`` trains a byte-level BPE (so any text round-trips exactly) on a short
built-in corpus and wraps it as a ``PreTrainedTokenizerFast`` with SmolLM2's special tokens and
chat template. Training takes a few milliseconds and is deterministic.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
PAD = "<|pad|>"
SPECIAL_TOKENS = [PAD, IM_START, IM_END]
TINY_VOCAB_SIZE = 384
TINY_SYSTEM_PROMPT = "You are a tiny helpful test assistant."

# SmolLM2-135M-Instruct's template with another default system prompt.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '" + IM_START + "system\\n" + TINY_SYSTEM_PROMPT + IM_END + "\\n' }}"
    "{% endif %}"
    "{{ '" + IM_START + "' + message['role'] + '\\n' + message['content'] + '" + IM_END + "' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '" + IM_START + "assistant\\n' }}{% endif %}"
)

CORPUS = """
What is the best way to learn a new language? Practice every day, read simple books, and talk
with people who speak it. How do plants make food from light? They use sunlight, water and air
in their green leaves. Can you explain why the sky is blue? Light from the sun is scattered by
the air, and blue light is scattered the most. Write a short poem about the sea and the moon.
Give me three tips for cooking rice. Rinse the rice, use the right amount of water, and let it
rest after cooking. Why do cats sleep so much? What is the capital city of France? Paris is the
capital and the largest city. How many days are there in a year? Tell me a story about a small
dog who wanted to fly. Summarise the main idea of this text in one sentence. Which planet is the
largest in our solar system? Jupiter is the largest planet. How does a computer store numbers?
It uses bits that are either zero or one. What should I pack for a trip to the mountains? Bring
warm clothes, good shoes, water and a map. Explain the difference between weather and climate.
Weather changes from day to day, while climate is the pattern over many years. How can I sleep
better at night? Go to bed at the same time, avoid screens, and keep the room dark and quiet.
What are the benefits of walking? It is good for the heart, the mind and the body. Please help
me write an email to my teacher. Describe a busy market in the morning. How do birds know where
to go in winter? They follow the stars, the sun and the shape of the land. What is a healthy
breakfast? Fruit, eggs, bread and tea make a simple healthy meal.
"""


def train_tiny_bpe(vocab_size: int = TINY_VOCAB_SIZE) -> Tokenizer:
    """Byte-level BPE trained on ``CORPUS``; the special tokens get the first ids."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([CORPUS], trainer=trainer)
    return tokenizer


def make_tiny_tokenizer(vocab_size: int = TINY_VOCAB_SIZE) -> PreTrainedTokenizerFast:
    """A ChatML tokenizer like SmolLM2's: ``<|im_start|>`` is BOS, ``<|im_end|>`` ends a turn."""
    return PreTrainedTokenizerFast(
        tokenizer_object=train_tiny_bpe(vocab_size),
        bos_token=IM_START,
        eos_token=IM_END,
        pad_token=PAD,
        chat_template=CHATML_TEMPLATE,
    )
