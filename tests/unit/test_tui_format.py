"""Function names for display (tui/format.py short_function, short_functions): shortened as
`go tool pprof` shows them, never two functions shown as one."""

from __future__ import annotations

import pytest
from rsprof.tui.format import short_function, short_functions


@pytest.mark.parametrize("full,shown", [
    ("std::sort<__gnu_cxx::__normal_iterator<int*, std::vector<int> >, main(int, char**)::"
     "<lambda(int, int)> >", "std::sort<…>"),
    ("void std::__introsort_loop<__gnu_cxx::__normal_iterator<int*, std::vector<int> >, long>"
     "(__gnu_cxx::__normal_iterator<int*, std::vector<int> >, long)", "std::__introsort_loop<…>"),
    ("main::{lambda(int, int)#2}::operator()", "main::{lambda(int, int)#2}::operator()"),
    ("main::{lambda(int, int)#2}::operator()(int, int) const",
     "main::{lambda(int, int)#2}::operator()"),
    ("Pool::Pool(int)::{lambda()#1}::operator()() const",
     "Pool::Pool(int)::{lambda()#1}::operator()"),
    ("shop::Basket::total() const", "shop::Basket::total"),
    ("std::_Function_handler<void (), main::{lambda()#4}>::_M_invoke(std::_Any_data const&)",
     "std::_Function_handler<…>::_M_invoke"),
    ("std::enable_if<std::__is_tuple_like<int>::value, void>::type std::swap<int>(int&, int&)",
     "std::swap<…>"),
    ("__gnu_cxx::__ops::_Iter_comp_iter<main(int, char**)::<lambda(int, int)> >::operator()"
     "<int*, int*>", "__gnu_cxx::__ops::_Iter_comp_iter<…>::operator()<…>"),
    ("bool operator<(Foo const&, Foo const&)", "operator<"),
    ("Foo::operator<<(int)", "Foo::operator<<"),
    ("__gnu_cxx::__normal_iterator<int*, std::vector<int> >::difference_type __gnu_cxx::"
     "operator-<int*, std::vector<int> >(__gnu_cxx::__normal_iterator<int*> const&)",
     "__gnu_cxx::operator-<…>"),
    ("bool std::operator< <int>(std::vector<int> const&)", "std::operator< <…>"),
    ("auto operator<=>(A const&)", "operator<=>"),
    ("x::operator->() const", "x::operator->"),
    ("void* operator new(unsigned long)", "operator new"),
    ("foo::operator std::string() const", "foo::operator std::string"),
    ("operator delete(void*)@plt", "operator delete@plt"),
    ("write@plt", "write@plt"),
    ("memcpy@@GLIBC_2.14", "memcpy@@GLIBC_2.14"),
    ("ns::(anonymous namespace)::f(int)", "ns::(anonymous namespace)::f"),
    # Not C++ templates or parameter lists: left alone.
    ("<module>", "<module>"), ("[kernel]", "[kernel]"), ("[truncated]", "[truncated]"),
    ("<T as core::fmt::Display>::fmt", "<T as core::fmt::Display>::fmt"),
    ("alloc::vec::Vec<T,A>::push", "alloc::vec::Vec<…>::push"),
    ("Class.method", "Class.method"), ("all samples", "all samples"),
    ("shop+0x2acf", "shop+0x2acf"), ("main", "main"),
])
def test_short_function(full: str, shown: str) -> None:
    assert short_function(full) == shown


def test_two_functions_never_look_the_same() -> None:
    """Two lambdas' _M_invoke shorten alike: they keep their template arguments; two
    overloads that differ only in their parameters keep their full names."""
    handler = "std::_Function_handler<void (), main::{lambda()#%d}>::_M_invoke"
    invoke3, invoke4 = (handler % n + "(std::_Any_data const&)" for n in (3, 4))
    shown = short_functions([invoke3, invoke4, "f(int)", "f(long)", "std::sort<int*>(int*, int*)"])
    assert shown[invoke3] == "std::_Function_handler<void (), main::{lambda()#3}>::_M_invoke"
    assert shown[invoke4] == "std::_Function_handler<void (), main::{lambda()#4}>::_M_invoke"
    assert shown["f(int)"] == "f(int)" and shown["f(long)"] == "f(long)"
    assert shown["std::sort<int*>(int*, int*)"] == "std::sort<…>"
    assert len(set(shown.values())) == len(shown)
