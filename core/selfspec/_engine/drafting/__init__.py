"""The drafting room (top): the draft mechanics plugins build on: skip-layer drafts, draft
trees and their options, n-gram retrieval, and the shared compressed draft weights. It
imports the contract, the runner and tuning below it; nothing imports it but the public
namespaces."""
