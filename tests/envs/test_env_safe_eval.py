"""The calculator evaluates whitelisted integer arithmetic and refuses everything else with a clear error."""

from __future__ import annotations

import pytest

from zeromismatch.envs.safe_eval import UnsafeExpressionError, safe_eval


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("1+2*3", 7),
        ("(1+2)*3", 9),
        ("-7//2", -4),
        ("17%5", 2),
        ("2**10", 1024),
        ("-(3-5)", 2),
        ("+4", 4),
        (" 12 * 12 ", 144),
        ("123*45+67", 5602),
        ("2**3**2", 512),
    ],
)
def test_allowed_arithmetic(expression, value):
    assert safe_eval(expression) == value


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("__import__('os').system('true')", "calls are not allowed"),
        ("(1).__class__", "attribute access is not allowed"),
        ("x + 1", "names are not allowed"),
        ("abs(-1)", "calls are not allowed"),
        ("[1, 2][0]", "subscripts are not allowed"),
        ("lambda: 1", "lambdas are not allowed"),
        ("1 < 2", "comparisons are not allowed"),
        ("'a' * 3", "only integer literals"),
        ("1.5 + 1", "only integer literals"),
        ("True + 1", "only integer literals"),
        ("7 / 2", "Div is not allowed"),
        ("1 << 3", "LShift is not allowed"),
        ("~1", "Invert is not allowed"),
        ("2**100000", "exponent 100000 exceeds the limit"),
        ("9**9**9", "exceeds the limit"),
        ("10**18*10", "magnitude limit"),
        ("2**-1", "negative exponents"),
        ("1//0", "division by zero"),
        ("5%0", "division by zero"),
        ("1 +", "not valid arithmetic"),
        ("", "empty"),
        ("(" * 40 + "1" + ")" * 40, "nests deeper"),
        ("1+" * 150 + "1", "characters; the limit"),
        ("[x for x in ()]", "ListComp is not allowed"),
    ],
)
def test_refused_with_clear_error(expression, reason):
    with pytest.raises(UnsafeExpressionError, match=reason):
        safe_eval(expression)


def test_huge_power_is_refused_from_its_operands():
    # 99**64 has ~425 bits; refused by the operand check, before the power is computed
    with pytest.raises(UnsafeExpressionError, match="99\\*\\*64 would exceed the magnitude limit"):
        safe_eval("99**64")


def test_error_is_a_value_error_and_type_checked():
    assert issubclass(UnsafeExpressionError, ValueError)
    with pytest.raises(TypeError, match="expression must be str"):
        safe_eval(12)
