/** The extension's core: no `vscode` import (tsconfig.core.json type-checks it without
 * VS Code's types), so `node --test` runs it against a real mtgpu-server. */

export * from "./api";
export * from "./cli";
export * from "./models";
export * from "./servers";
export * from "./signing";
export * from "./snapshot";
export * from "./tree";
export * from "./uris";
