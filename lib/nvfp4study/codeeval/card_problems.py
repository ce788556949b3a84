"""The fifteen card-style coding problems, as data: ``(name, prompt, canonical body, test)``.

Written for this study in HumanEval's shape: ``prompt`` is imports plus a signature and
docstring (ending with a newline), the body completes it, and ``test`` defines
``check(candidate)``. The model card's junk examples come from exactly this kind of code
(``stack.append(c)ulp`` from a bracket matcher, ``high = len(arr) -  Advisory`` and
``elif arr[mid] < x Advisory:`` from a binary search, ``seen.add(culp)`` from an
order-preserving dedupe), so the list starts with those three and adds twelve more of the same
size. The card's claim sets of 15 and 10 tasks are defined on this list, in this order
(``CorruptionParams.claim_tasks``; see :func:`nvfp4study.codeeval.served_data.claim_task_ids`).
:func:`nvfp4study.codeeval.tasks.card_tasks` turns the rows into :class:`~nvfp4study.codeeval.tasks.Task`;
every body passes its test (``tests/test_tasks.py`` runs them in the sandbox).
"""

from __future__ import annotations

CARD_PROBLEMS: list[tuple[str, str, str, str]] = [
    (
        "binary_search",
        '''from typing import List


def binary_search(arr: List[int], x: int) -> int:
    """Return the index of x in the sorted list arr, or -1 if x is not present.
    Use an iterative binary search.
    >>> binary_search([1, 3, 5, 7], 5)
    2
    >>> binary_search([1, 3, 5, 7], 4)
    -1
    """
''',
        '''    low, high = 0, len(arr) - 1
    while low <= high:
        mid = (low + high) // 2
        if arr[mid] == x:
            return mid
        elif arr[mid] < x:
            low = mid + 1
        else:
            high = mid - 1
    return -1
''',
        '''def check(candidate):
    assert candidate([1, 3, 5, 7], 5) == 2
    assert candidate([1, 3, 5, 7], 4) == -1
    assert candidate([], 1) == -1
    assert candidate([2], 2) == 0
    assert candidate(list(range(0, 200, 2)), 198) == 99
    assert candidate(list(range(0, 200, 2)), 0) == 0
    assert candidate(list(range(0, 200, 2)), 199) == -1
''',
    ),
    (
        "is_balanced",
        '''def is_balanced(s: str) -> bool:
    """Return True if the brackets (), [] and {} in s are balanced and properly nested.
    Other characters are ignored. Use a stack.
    >>> is_balanced("([]{})")
    True
    >>> is_balanced("([)]")
    False
    """
''',
        '''    pairs = {")": "(", "]": "[", "}": "{"}
    stack = []
    for c in s:
        if c in "([{":
            stack.append(c)
        elif c in pairs:
            if not stack or stack.pop() != pairs[c]:
                return False
    return not stack
''',
        '''def check(candidate):
    assert candidate("([]{})") is True
    assert candidate("([)]") is False
    assert candidate("") is True
    assert candidate("a(b[c]d)e") is True
    assert candidate("((") is False
    assert candidate("())") is False
    assert candidate("}{") is False
''',
    ),
    (
        "dedupe",
        '''def dedupe(items: list) -> list:
    """Return the items of the list without duplicates, keeping the first occurrence of each
    and the original order.
    >>> dedupe([3, 1, 3, 2, 1])
    [3, 1, 2]
    """
''',
        '''    seen = set()
    out = []
    for item in items:
        if item not in seen:
            seen.add(item)
            out.append(item)
    return out
''',
        '''def check(candidate):
    assert candidate([3, 1, 3, 2, 1]) == [3, 1, 2]
    assert candidate([]) == []
    assert candidate(["a", "b", "a", "c", "b"]) == ["a", "b", "c"]
    assert candidate([1, 1, 1]) == [1]
    assert candidate([5, 4, 3]) == [5, 4, 3]
''',
    ),
    (
        "merge_sorted",
        '''from typing import List


def merge_sorted(a: List[int], b: List[int]) -> List[int]:
    """Merge two sorted lists into one sorted list in linear time (do not call sort).
    >>> merge_sorted([1, 4, 9], [2, 3, 10])
    [1, 2, 3, 4, 9, 10]
    """
''',
        '''    i = j = 0
    out = []
    while i < len(a) and j < len(b):
        if a[i] <= b[j]:
            out.append(a[i])
            i += 1
        else:
            out.append(b[j])
            j += 1
    out.extend(a[i:])
    out.extend(b[j:])
    return out
''',
        '''def check(candidate):
    assert candidate([1, 4, 9], [2, 3, 10]) == [1, 2, 3, 4, 9, 10]
    assert candidate([], [1, 2]) == [1, 2]
    assert candidate([1, 2], []) == [1, 2]
    assert candidate([1, 1], [1]) == [1, 1, 1]
    assert candidate([-5, 0], [-6, 7]) == [-6, -5, 0, 7]
''',
    ),
    (
        "two_sum",
        '''from typing import List, Optional, Tuple


def two_sum(nums: List[int], target: int) -> Optional[Tuple[int, int]]:
    """Return (i, j) with i < j and nums[i] + nums[j] == target, or None if there is no such
    pair. Each test has at most one answer. Use a dictionary of values seen so far.
    >>> two_sum([2, 7, 11, 15], 9)
    (0, 1)
    """
''',
        '''    index = {}
    for j, value in enumerate(nums):
        if target - value in index:
            return (index[target - value], j)
        index[value] = j
    return None
''',
        '''def check(candidate):
    assert candidate([2, 7, 11, 15], 9) == (0, 1)
    assert candidate([3, 2, 4], 6) == (1, 2)
    assert candidate([1, 2, 3], 100) is None
    assert candidate([], 0) is None
    assert candidate([5, -2, 8], 3) == (0, 1)
''',
    ),
    (
        "run_length_encode",
        '''def run_length_encode(s: str) -> str:
    """Encode runs of repeated characters as the character followed by the run length.
    >>> run_length_encode("aaabcc")
    'a3b1c2'
    """
''',
        '''    if not s:
        return ""
    out = []
    current, count = s[0], 1
    for c in s[1:]:
        if c == current:
            count += 1
        else:
            out.append(f"{current}{count}")
            current, count = c, 1
    out.append(f"{current}{count}")
    return "".join(out)
''',
        '''def check(candidate):
    assert candidate("aaabcc") == "a3b1c2"
    assert candidate("") == ""
    assert candidate("x") == "x1"
    assert candidate("aaaaaaaaaaaa") == "a12"
    assert candidate("abab") == "a1b1a1b1"
''',
    ),
    (
        "evaluate_rpn",
        '''from typing import List


def evaluate_rpn(tokens: List[str]) -> int:
    """Evaluate an expression in reverse Polish notation with a stack. Tokens are integers
    or one of + - * /; division truncates toward zero.
    >>> evaluate_rpn(["2", "1", "+", "3", "*"])
    9
    """
''',
        '''    stack = []
    for tok in tokens:
        if tok in ("+", "-", "*", "/"):
            b = stack.pop()
            a = stack.pop()
            if tok == "+":
                stack.append(a + b)
            elif tok == "-":
                stack.append(a - b)
            elif tok == "*":
                stack.append(a * b)
            else:
                stack.append(int(a / b))
        else:
            stack.append(int(tok))
    return stack[-1]
''',
        '''def check(candidate):
    assert candidate(["2", "1", "+", "3", "*"]) == 9
    assert candidate(["4", "13", "5", "/", "+"]) == 6
    assert candidate(["7"]) == 7
    assert candidate(["-7", "2", "/"]) == -3
    assert candidate(["3", "4", "-"]) == -1
''',
    ),
    (
        "max_subarray_sum",
        '''from typing import List


def max_subarray_sum(nums: List[int]) -> int:
    """Return the largest sum of a non-empty contiguous sublist of nums (nums is non-empty).
    >>> max_subarray_sum([-2, 1, -3, 4, -1, 2, 1, -5, 4])
    6
    """
''',
        '''    best = current = nums[0]
    for x in nums[1:]:
        current = max(x, current + x)
        best = max(best, current)
    return best
''',
        '''def check(candidate):
    assert candidate([-2, 1, -3, 4, -1, 2, 1, -5, 4]) == 6
    assert candidate([1]) == 1
    assert candidate([-3, -1, -2]) == -1
    assert candidate([5, 4, -1, 7, 8]) == 23
''',
    ),
    (
        "flatten",
        '''def flatten(nested: list) -> list:
    """Flatten arbitrarily nested lists into one list, keeping the order of the elements.
    >>> flatten([1, [2, [3, 4]], 5])
    [1, 2, 3, 4, 5]
    """
''',
        '''    out = []
    for item in nested:
        if isinstance(item, list):
            out.extend(flatten(item))
        else:
            out.append(item)
    return out
''',
        '''def check(candidate):
    assert candidate([1, [2, [3, 4]], 5]) == [1, 2, 3, 4, 5]
    assert candidate([]) == []
    assert candidate([[[]]]) == []
    assert candidate([["a"], "b", [["c"]]]) == ["a", "b", "c"]
''',
    ),
    (
        "word_frequencies",
        '''from typing import Dict


def word_frequencies(text: str) -> Dict[str, int]:
    """Count the words of text, split on whitespace and compared in lower case.
    >>> word_frequencies("the cat The dog")
    {'the': 2, 'cat': 1, 'dog': 1}
    """
''',
        '''    counts = {}
    for word in text.lower().split():
        counts[word] = counts.get(word, 0) + 1
    return counts
''',
        '''def check(candidate):
    assert candidate("the cat The dog") == {"the": 2, "cat": 1, "dog": 1}
    assert candidate("") == {}
    assert candidate("  a\\tA\\na ") == {"a": 3}
    assert candidate("x y z") == {"x": 1, "y": 1, "z": 1}
''',
    ),
    (
        "first_unique_char",
        '''def first_unique_char(s: str) -> int:
    """Return the index of the first character that occurs exactly once in s, or -1.
    >>> first_unique_char("leetcode")
    0
    >>> first_unique_char("aabb")
    -1
    """
''',
        '''    counts = {}
    for c in s:
        counts[c] = counts.get(c, 0) + 1
    for i, c in enumerate(s):
        if counts[c] == 1:
            return i
    return -1
''',
        '''def check(candidate):
    assert candidate("leetcode") == 0
    assert candidate("loveleetcode") == 2
    assert candidate("aabb") == -1
    assert candidate("") == -1
    assert candidate("zz y") == 2
''',
    ),
    (
        "rotate_left",
        '''def rotate_left(items: list, k: int) -> list:
    """Return a new list with the items rotated k places to the left (k may exceed the
    length; an empty list stays empty).
    >>> rotate_left([1, 2, 3, 4, 5], 2)
    [3, 4, 5, 1, 2]
    """
''',
        '''    if not items:
        return []
    k %= len(items)
    return items[k:] + items[:k]
''',
        '''def check(candidate):
    assert candidate([1, 2, 3, 4, 5], 2) == [3, 4, 5, 1, 2]
    assert candidate([1, 2, 3], 0) == [1, 2, 3]
    assert candidate([1, 2, 3], 4) == [2, 3, 1]
    assert candidate([], 3) == []
    original = [1, 2]
    assert candidate(original, 1) == [2, 1] and original == [1, 2]
''',
    ),
    (
        "longest_common_prefix",
        '''from typing import List


def longest_common_prefix(words: List[str]) -> str:
    """Return the longest string that is a prefix of every word ("" for an empty list).
    >>> longest_common_prefix(["flower", "flow", "flight"])
    'fl'
    """
''',
        '''    if not words:
        return ""
    prefix = words[0]
    for word in words[1:]:
        while not word.startswith(prefix):
            prefix = prefix[:-1]
    return prefix
''',
        '''def check(candidate):
    assert candidate(["flower", "flow", "flight"]) == "fl"
    assert candidate(["dog", "racecar", "car"]) == ""
    assert candidate([]) == ""
    assert candidate(["same", "same"]) == "same"
    assert candidate(["a"]) == "a"
''',
    ),
    (
        "remove_adjacent_duplicates",
        '''def remove_adjacent_duplicates(s: str) -> str:
    """Repeatedly remove pairs of equal adjacent characters until none remain (use a stack).
    >>> remove_adjacent_duplicates("abbaca")
    'ca'
    """
''',
        '''    stack = []
    for c in s:
        if stack and stack[-1] == c:
            stack.pop()
        else:
            stack.append(c)
    return "".join(stack)
''',
        '''def check(candidate):
    assert candidate("abbaca") == "ca"
    assert candidate("") == ""
    assert candidate("aa") == ""
    assert candidate("abc") == "abc"
    assert candidate("azxxzy") == "ay"
''',
    ),
    (
        "fibonacci",
        '''def fibonacci(n: int) -> int:
    """Return the n-th Fibonacci number (fibonacci(0) == 0, fibonacci(1) == 1), computed
    iteratively.
    >>> fibonacci(10)
    55
    """
''',
        '''    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a
''',
        '''def check(candidate):
    assert candidate(0) == 0
    assert candidate(1) == 1
    assert candidate(2) == 1
    assert candidate(10) == 55
    assert candidate(90) == 2880067194370816120
''',
    ),
]
