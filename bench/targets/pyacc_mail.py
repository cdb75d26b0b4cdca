"""difflib and email: unified diffs and SequenceMatcher ratios of generated texts, and
MIME messages parsed with email.policy.default (whose header classes are created with
type() for every header: class creation under type_call) and walked. Deterministic.
For bench/bench_pyaccuracy.py."""
import difflib
import email
import email.policy
import random

from pyacc_timing import main

rng = random.Random(21)
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota",
         "kappa", "lambda", "mu", "nu", "xi", "omicron", "pi", "rho", "sigma", "tau"]


def sentence():
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12)))


A = [sentence() for _ in range(400)]
B = [line if rng.random() < 0.8 else sentence() for line in A]


def message(i):
    parts = "".join(
        f"--BOUNDARY\nContent-Type: text/plain; charset=utf-8\nContent-Disposition: "
        f"attachment; filename=\"part{j}.txt\"\n\n{sentence()}\n{sentence()}\n"
        for j in range(3))
    return (f"From: Sender {i} <sender{i}@example.com>\nTo: a@example.com, b@example.org\n"
            f"Cc: c@example.net\nSubject: =?utf-8?q?report_{i}?= {sentence()}\n"
            f"Date: Thu, 26 Nov 2026 18:00:{i % 60:02d} +0000\nMessage-ID: <{i}@example.com>\n"
            f"MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=\"BOUNDARY\"\n\n"
            f"{parts}--BOUNDARY--\n")


MESSAGES = [message(i) for i in range(40)]


def diff_texts():
    return sum(1 for _ in difflib.unified_diff(A, B, lineterm=""))


def ratios():
    return sum(difflib.SequenceMatcher(None, a, b).ratio() for a, b in zip(A[:120], B[:120]))


def parse_mail():
    total = 0
    for text in MESSAGES:
        msg = email.message_from_string(text, policy=email.policy.default)
        total += len(str(msg["subject"])) + len(msg["to"].addresses)
        for part in msg.walk():
            if part.get_content_maintype() == "text":
                total += len(part.get_content())
    return total


def work(rounds):
    for _ in range(rounds):
        diff_texts()
        ratios()
        parse_mail()


if __name__ == "__main__":
    main(work)
