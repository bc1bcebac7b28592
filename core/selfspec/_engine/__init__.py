"""The engine's implementation (private), in four rooms with one way down: ``drafting`` ->
``contract`` -> ``runner`` -> ``tuning`` (a module imports its own room and the rooms below;
``tests/test_engine_rooms.py``). Its public names are re-exported by ``selfspec`` (the stable
contract) and ``selfspec.provisional``; nothing here is imported by name from outside the
package."""
