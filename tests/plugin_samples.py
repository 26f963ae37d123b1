"""Plugins that misbehave in the ways real third-party plugins do, for the registry tests."""

from __future__ import annotations

from stateset_backend.adapters.native import NativeAdapter
from stateset_backend.core.hookspecs import hookimpl


class RaisesInHook:
    @hookimpl
    def register_adapters(self, register):
        raise RuntimeError("adapter setup exploded")


class TakesNativeName:
    @hookimpl
    def register_adapters(self, register):
        register(NativeAdapter())


class RegistersNonsense:
    @hookimpl
    def register_adapters(self, register):
        register(object())


class WrongHookSignature:
    @hookimpl
    def register_adapters(self, register, not_a_hook_argument):
        raise AssertionError("never called")


class NoArguments:
    """A hook implementation may take fewer arguments than the spec declares."""

    @hookimpl
    def register_adapters(self):
        return None


raises_in_hook = RaisesInHook()
takes_native_name = TakesNativeName()
registers_nonsense = RegistersNonsense()
wrong_hook_signature = WrongHookSignature()
no_arguments = NoArguments()
