/**
 * ioredis declares a subclass of String (`VerbatimString`, in its RESP3 decoder) when it
 * loads. Declaring it leaves String.prototype in V8's slow (dictionary) mode, where each
 * method looked up on a string (`s.indexOf`, `s.charCodeAt`, in keyward and in the
 * libraries on the request path) is no longer compiled to a map check but goes through a
 * generic lookup every time. V8 rebuilds a prototype in its fast mode when a property is
 * added to an object whose prototype chain holds it: one such store, on a String object of
 * keyward's own, once ioredis has loaded. Nothing of String.prototype itself is changed,
 * and a test pins the effect (docs/performance.md, "String methods after ioredis").
 */
import 'ioredis';

(new String('') as unknown as { rebuilt?: true }).rebuilt = true;
