"""Plugins that misbehave in the ways real third-party plugins do, for the registry tests."""

from __future__ import annotations

from stateset_backend.adapters.native.adapter import NativeAdapter
from stateset_backend.engines.hookspecs import hookimpl


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


class _Exploding(NativeAdapter):
    """An adapter whose methods raise what third-party code raises: anything."""

    name = "exploding"

    @property
    def contract(self):
        from stateset_backend.contracts.loader import parse_contract

        doc = NativeAdapter().contract.to_json()
        return parse_contract({**doc, "engine": "exploding"}, source="exploding")

    def rules(self, dialect):
        raise ZeroDivisionError("rules blew up")

    def installed_version(self, python=None, home=None):
        raise RuntimeError("version probe blew up")


class RegistersExploding:
    @hookimpl
    def register_adapters(self, register):
        register(_Exploding())


class ForgotHookimpl:
    """A plugin whose hook lacks the hookimpl mark: pluggy registers it and calls nothing."""

    def register_adapters(self, register):
        register(NativeAdapter())


raises_in_hook = RaisesInHook()
forgot_hookimpl = ForgotHookimpl()
registers_exploding = RegistersExploding()
takes_native_name = TakesNativeName()
registers_nonsense = RegistersNonsense()
wrong_hook_signature = WrongHookSignature()
no_arguments = NoArguments()
