/** Remote GPU for VS Code: the joined servers, your workspaces and jobs, and the ways in. */

import * as vscode from "vscode";

import { registerCommands } from "./views/commands";
import { Session } from "./views/session";

export function activate(context: vscode.ExtensionContext): void {
  const session = new Session();
  context.subscriptions.push(session);
  registerCommands(context, session);
}

export function deactivate(): void {
  // The session is disposed with the context's subscriptions.
}
