"""Check the held-out question files in this folder.

Every `*.jsonl` line must be a JSON object with the keys question, answer, document and
evidence (a non-empty list of strings); the document (a path relative to this folder) must
exist; every evidence string must be an exact substring of the document's text; the answer
must appear (case-insensitively) inside at least one evidence string; the answer should be a
short phrase (1-5 words); and no question may repeat, within a file or across files.

Run: python bench/questions/check.py [file.jsonl ...]   (all *.jsonl here by default)
Exit status 1 when any line fails.
"""
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REQUIRED = ("question", "answer", "document", "evidence")


def norm(question: str) -> str:
    return " ".join(question.lower().split()).rstrip("?")


def check(files):
    texts, seen, errors, counts = {}, {}, [], {}
    for path in files:
        n = 0
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            n += 1
            where = f"{path.name}:{lineno}"
            try:
                item = json.loads(line)
            except json.JSONDecodeError as e:
                errors.append(f"{where}: not JSON ({e})")
                continue
            missing = [k for k in REQUIRED if k not in item]
            if missing:
                errors.append(f"{where}: missing key(s) {missing}")
                continue
            question, answer, evidence = item["question"], item["answer"], item["evidence"]
            if not (isinstance(question, str) and question.strip()):
                errors.append(f"{where}: empty question")
            if not (isinstance(answer, str) and answer.strip()):
                errors.append(f"{where}: empty answer")
                continue
            if not (isinstance(evidence, list) and evidence and all(isinstance(e, str) and e for e in evidence)):
                errors.append(f"{where}: evidence must be a non-empty list of non-empty strings")
                continue
            if not 1 <= len(answer.split()) <= 5:
                errors.append(f"{where}: answer {answer!r} is not 1-5 words")
            doc = (path.parent / item["document"]).resolve()
            if doc not in texts:
                texts[doc] = doc.read_text(encoding="utf-8") if doc.is_file() else None
            text = texts[doc]
            if text is None:
                errors.append(f"{where}: document {item['document']} not found")
                continue
            for e in evidence:
                if e not in text:
                    errors.append(f"{where}: evidence not found in {doc.name}: {e[:70]!r}")
            if not any(answer.lower() in e.lower() for e in evidence):
                errors.append(f"{where}: answer {answer!r} in no evidence string")
            key = norm(question)
            if key in seen:
                errors.append(f"{where}: duplicate of question at {seen[key]}")
            else:
                seen[key] = where
        counts[path.name] = n
    return counts, errors


def main(argv):
    files = [Path(a).resolve() for a in argv] or sorted(HERE.glob("*.jsonl"))
    counts, errors = check(files)
    for name, n in counts.items():
        print(f"{name}: {n} questions")
    print(f"total: {sum(counts.values())} questions in {len(counts)} files")
    for e in errors:
        print("ERROR", e)
    print("OK" if not errors else f"{len(errors)} error(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
